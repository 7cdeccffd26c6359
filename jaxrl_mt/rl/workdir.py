"""A training workdir's guards: start-up field checks, the resume-config check, the finite-update check.

Three faults a run must not turn into silent damage (issue 32):

* a value that cannot work (``rl.lr=inf``, ``checkpoint.every=0``): refused at start-up with one line
  (``rl.config_checks.field_checks``, part of ``rl.data.validate_config``);
* a resumed workdir whose config changed in a field that changes the data (the cached items would
  be reused silently) or the optimizer state's structure (the checkpoint cannot be restored):
  refused with one line naming the fields, before ``config.json`` is rewritten
  (``check_resume_config``; ``allow_config_changes`` lets a named field through);
* an update that made the parameters or the optimizer state non-finite (a finite loss and gradient
  with an infinite step size): the step is not checkpointed and the run stops naming the last
  checkpoint, which every saved step passed (``check_finite_state``, ``last_good``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.rl.config_checks import flatten
from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.models.attention import record as attention_record
from jaxrl_mt.rl.run_config import RECORDED, TrainConfig, typed_config

__all__ = ["DATA_FIELDS", "NonFiniteUpdate", "check_finite_state", "check_resume_config", "last_good",
           "refused_changes"]

CONFIG_FILE = "config.json"
# config fields (dotted; a prefix covers a section) whose change alters the training items a resumed run reuses
DATA_FIELDS = ("method", "seed", "model", "system_prompt", "data", "history", "filter", "icpo")
# optimizer inputs: a change is refused when it changes the optimizer state's structure (rl.grad_accum, ...)
OPTIMIZER_FIELDS = ("rl.lr", "rl.schedule", "rl.warmup_steps", "rl.steps", "rl.weight_decay", "rl.max_grad_norm",
                    "rl.grad_accum")
ALLOW_FIELD = "allow_config_changes"
_CACHES = ("histories.jsonl", "train_items.jsonl", "heldout.jsonl", "metrics.jsonl")
class NonFiniteUpdate(RuntimeError):
    """An update left non-finite values in the parameters or the optimizer state; the step is not saved."""


# ----------------------------------------------------------------------------- resume


def _opt_structure(config: Mapping[str, Any]) -> Any:
    from jaxrl_mt.rl.optim import optimizer_from_config

    try:
        return jax.tree.structure(optimizer_from_config(typed_config(config).rl).init({"w": jnp.zeros(1)}))
    except (ValueError, KeyError, TypeError) as e:  # an optimizer that cannot be built differs from any other
        return f"unbuildable: {e}"


def refused_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Dotted fields that differ and change the data or the optimizer state's structure.

    Args:
      old: the stored config (``config.json`` of the first run).
      new: this run's config.

    Returns:
      ``["data.add_source", "rl.grad_accum"]``-like names, sorted; each optimizer input is tested
      alone (the old ``rl`` section with that one value changed), so an allowed change that comes
      along (``rl.steps``) is not named.
    """
    fo, fn = flatten(old), flatten(new)
    changed = sorted(k for k in set(fo) | set(fn) if fo.get(k) != fn.get(k) and k != ALLOW_FIELD)
    out = [k for k in changed if any(k == f or k.startswith(f + ".") for f in DATA_FIELDS)]
    base = _opt_structure(old)
    for k in changed:
        if k in OPTIMIZER_FIELDS and k in fn:
            rl = {**old.get("rl", {}), k.split(".", 1)[1]: fn[k]}
            if _opt_structure({**old, "rl": rl}) != base:
                out.append(k)
    return sorted(out)


def _is_resume(wd: Path) -> bool:
    ck = wd / "checkpoints"
    steps = ck.is_dir() and any(p.name.isdigit() for p in ck.iterdir())
    return (wd / CONFIG_FILE).is_file() and (steps or any((wd / f).exists() for f in _CACHES))


def check_resume_config(c: TrainConfig, *, write: bool = True,
                        log: Callable[[str], None] = print) -> TrainConfig | None:
    """Compares a resumed workdir's ``config.json`` with ``c``, then writes ``c`` there.

    Args:
      c: this run's config; its ``allow_config_changes`` (comma-separated dotted fields, ``*`` for any)
        lets named refused fields through (logged: the cached items are reused, an optimizer of another
        structure starts from a fresh state).
      write: write ``config.json`` (process 0) after the check.
      log: receives the line about allowed changes.

    Returns:
      The stored config when an allowed change altered the optimizer state's structure (the loop
      restores the checkpoint with the stored optimizer and starts a fresh state), else None.

    Raises:
      ConfigError: ``<workdir>/config.json: resuming with changed field(s) ...`` naming them; the
        file is left as it was.
    """
    wd = Path(c.workdir)
    new = c.to_dict()
    old_structure = None
    recorded = {RECORDED: attention_record(c.attention)}  # JAXRL_MT_ATTENTION, if set, is in the file
    if _is_resume(wd):
        path = wd / CONFIG_FILE
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path}: unreadable ({type(e).__name__}: {e}); move it aside or use another "
                              "workdir") from None
        refused = refused_changes(old, new)
        allow = {s.strip() for s in str(new.get(ALLOW_FIELD, "") or "").split(",") if s.strip()}
        blocked = [k for k in refused if "*" not in allow and k not in allow]
        if blocked:
            fo, fn = flatten(old), flatten(new)
            what = "; ".join(f"{k}: {fo.get(k)!r} -> {fn.get(k)!r}" for k in blocked)
            raise ConfigError(f"{path}: resuming with changed field(s) that change the data or the optimizer "
                              f"state: {what}; use another workdir, or set {ALLOW_FIELD}="
                              f"{','.join(blocked)!r} to resume anyway")
        if refused:
            log(f"{ALLOW_FIELD}: resuming with changed {', '.join(refused)} (cached items are reused; an "
                "optimizer of another structure starts from a fresh state)")
        if any(k in OPTIMIZER_FIELDS for k in refused):
            old_structure = typed_config(old)
    if jax.process_count() > 1:  # every process has read the stored config before process 0 replaces it
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("jaxrl_mt_resume_config_check")
    if write:
        (wd / CONFIG_FILE).write_text(json.dumps({**new, **recorded}, indent=2, sort_keys=True))
    return old_structure


# ----------------------------------------------------------------------------- finite updates


@jax.jit
def _nonfinite_flags(leaves: list[jax.Array]) -> jax.Array:
    return jnp.stack([~jnp.all(jnp.isfinite(x)) for x in leaves])


def _path(path: tuple[Any, ...]) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def nonfinite_paths(tree: Any) -> tuple[list[str], int]:
    """Key paths of the floating-point leaves of ``tree`` that hold a NaN or an infinity.

    One jitted reduction over all leaves (global arrays of a multi-process run included: every
    process calls it and gets the same answer).

    Returns:
      ``(paths, n_float_leaves)``.
    """
    pairs = [(p, x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
             if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
    if not pairs:
        return [], 0
    flags = _nonfinite_flags([x for _, x in pairs])
    flags = np.asarray(flags.addressable_data(0) if hasattr(flags, "addressable_data") else flags)
    return [_path(p) for (p, _), bad in zip(pairs, flags) if bad], len(pairs)


def check_finite_state(step: int, state: Mapping[str, Any]) -> None:
    """Raises NonFiniteUpdate when ``state`` (params, optimizer state) holds a non-finite value.

    Call it before a checkpoint of ``step`` is written: a saved step is one a resumed run can trust.
    """
    bad, n = nonfinite_paths(state)
    if bad:
        shown = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
        raise NonFiniteUpdate(f"the update left non-finite values in {len(bad)} of {n} arrays ({shown}); "
                              f"step {step} was not saved")


def last_good(ck: Any) -> str:
    """``last good checkpoint: step N in DIR``, or that there is none (never a step that does not exist)."""
    latest = ck.latest_step()
    if latest is None:
        return f"no checkpoint was written to {ck.directory} (a rerun starts from scratch)"
    return f"last good checkpoint: step {latest} in {ck.directory}"

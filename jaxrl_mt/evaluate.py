"""Command line LiC evaluation.

    python -m jaxrl_mt.evaluate --config configs/eval_lic.py:cpu --config.workdir=/tmp/eval_cpu
    python -m jaxrl_mt.evaluate --config configs/eval_lic.py:lic --config.model=workdir:/runs/rlsta

Loads the model (a registry spec, or ``workdir:PATH`` for a training checkpoint through
``jaxrl_mt.rl.policy_io.load_policy``, without the trainer; ``http:URL#MODEL`` evaluates a model behind an
OpenAI-compatible endpoint instead, see ``jaxrl_mt.eval.http_assistant``) and the instructions of each
selected task (``task``: one, a list or ``all``; ``datasets.TASK``: its source specs; see
``jaxrl_mt.eval.task_config``), plans N runs per instruction and scenario, simulates all of them in
lockstep (one sampler call per turn for the whole batch), and writes into the workdir:

- ``transcripts.jsonl``: one line per finished conversation, appended as they finish. A rerun
  with the same workdir skips the conversations already there (resume); the results-defining
  config fields are kept in ``eval_config.json`` and a rerun with different ones is refused.
- ``report.json``, ``report.md``, ``report.html`` and PNG plots, built from the transcripts (with a
  per-task FULL / SHARDED / ratio table when a task other than math ran).

Bad input (a misspelt config key, an unknown scenario, task or source, a record without an answer,
a failing backend, an unwritable workdir) ends the command with one line on stderr and exit status 2.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxrl_mt.backends import BackendError
from jaxrl_mt.cli_errors import check_writable_dir, config_value, one_line, parse_flags
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.remote import RemoteSampler
from jaxrl_mt.eval.http_assistant import check_http_config, http_backend_kw, is_http
from jaxrl_mt.eval.eval_config import EvalConfig, typed_eval_config
from jaxrl_mt.eval.report import build_report, write_report
from jaxrl_mt.eval.simulator import (
    PROTOCOLS,
    EvalError,
    TranscriptStore,
    canonical_scenarios,
    check_strategy,
    make_judge,
    plan_runs,
    simulate,
)
from jaxrl_mt.eval.task_config import (
    check_record,
    judged_plugins,
    parse_tasks,
    resolve_sources,
    with_task,
)
from jaxrl_mt.chat import ChatError, with_template_options
from jaxrl_mt.sampling import Sampler
from jaxrl_mt.sampling.counters import utilisation
from jaxrl_mt.models.attention import IMPLS as ATTENTION_IMPLS, record as attention_record
from jaxrl_mt.eval.task_scoring import conversation_system
from jaxrl_mt.rewards.abstain import with_abstain
from jaxrl_mt.models.config import ModelError
from jaxrl_mt.workdir_lock import hold_workdir
from jaxrl_mt.rewards.verifier import MODES, verify

__all__ = ["RESULT_FIELDS", "evaluate", "load_eval_model", "load_tasks", "make_sampler", "normalize_config"]

EXIT_BAD_INPUT = 2
TRANSCRIPTS, RUN_CONFIG = "transcripts.jsonl", "eval_config.json"
# Config fields that define the results of a conversation: a resumed run must keep them.
RESULT_FIELDS = ("model", "dtype", "dataset", "task", "shuffle_shards", "temperature", "top_p",
                 "max_new_tokens", "system_prompt", "protocol", "verifier_mode", "judge",
                 "user_simulator", "user_temperature", "strategy", "seed", "abstain", "enable_thinking")
# the value of a field that a workdir's older eval_config.json lacks
RESULT_DEFAULTS = {"abstain": False, "enable_thinking": None}
BACKEND_KINDS = ("local", "http")


def _tuple(value: Any, field: str) -> tuple[str, ...]:
    """A tuple of strings; ``"a,b"`` items (from the command line) are split at commas."""
    items = [value] if isinstance(value, str) else list(value)
    out = tuple(s.strip() for item in items for s in str(item).split(",") if s.strip())
    if not out:
        raise EvalError(f"config field '{field}': expected at least one value, got {value!r}")
    return out


def _backend_spec(value: str, field: str, default: str) -> str:
    if value != default and value.partition(":")[0] not in BACKEND_KINDS:
        raise EvalError(f"config field '{field}': unknown {value!r}; expected '{default}', 'local', "
                        "'local:MODEL' or 'http:URL#MODEL'")
    return value


def normalize_config(cfg: Any) -> EvalConfig:
    """Checks a config once and returns it typed, with the task selection resolved.

    Args:
      cfg: a ConfigDict or mapping (configs/eval_lic.py's fields; those added later may be absent
        and take their defaults), or an :class:`EvalConfig` (one already resolved keeps its
        ``tasks`` and ``sources``; its values are checked again).

    Returns:
      The frozen config with ``tasks`` and ``sources`` (task -> source specs) set, ``task`` and
      ``dataset`` as loaded (what ``eval_config.json`` keeps) and ``scenarios`` canonical.

    Raises:
      EvalError: an unknown, missing or mistyped field (:func:`typed_eval_config`), or
        ``config field 'name': ...`` for the first bad value.
    """
    c = typed_eval_config(cfg)
    if not c.tasks:
        tasks = parse_tasks(c.task, c.judge)
        sources = resolve_sources(tasks, c.dataset, c.datasets)
        c = c.replace(tasks=tuple(tasks), sources=sources, task=",".join(tasks),
                      dataset=tuple(s for specs in sources.values() for s in specs))  # as loaded
    c = c.replace(scenarios=canonical_scenarios(_tuple(c.scenarios, "scenarios")))
    if c.protocol not in PROTOCOLS:
        raise EvalError(f"config field 'protocol': unknown {c.protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if c.verifier_mode not in MODES:
        raise EvalError(f"config field 'verifier_mode': unknown {c.verifier_mode!r}; valid: {', '.join(MODES)}")
    checks = (("runs", c.runs >= 1), ("max_new_tokens", c.max_new_tokens >= 1),
              ("max_batch", c.max_batch >= 1), ("max_chunk_cells", c.max_chunk_cells >= 1),
              ("temperature", c.temperature >= 0),
              ("top_p", 0 < c.top_p <= 1), ("limit", c.limit >= 0), ("bootstrap", c.bootstrap >= 1))
    for name, ok in checks:
        if not ok:
            raise EvalError(f"config field '{name}': bad value {getattr(c, name)!r}")
    if c.attention not in ATTENTION_IMPLS:
        raise EvalError(f"config field 'attention': expected one of {', '.join(ATTENTION_IMPLS)}, "
                        f"got {c.attention!r}")
    _mesh(c.mesh_shape)
    check_http_config(c.model, c.strategy, c.http)
    _backend_spec(c.judge, "judge", "rule")
    _backend_spec(c.user_simulator, "user_simulator", "fixed")
    check_strategy(c.strategy)
    if not c.workdir.strip():
        raise EvalError("config field 'workdir': empty")
    return c


def _mesh(spec: str) -> Any:
    """The evaluation's device mesh (``parallel.mesh_from_spec``), or EvalError naming the field."""
    from jaxrl_mt.parallel import mesh_from_spec

    try:
        return mesh_from_spec(spec)
    except ValueError as e:
        raise EvalError(f"config field 'mesh_shape': {e}") from None


def make_sampler(model: Any, mesh_shape: str = "auto", max_batch: int | None = None) -> Any:
    """The evaluated model's sampler: data-parallel over the mesh of ``mesh_shape`` (rows, KV caches
    and the SeDT scorer's rows split over its (data, fsdp) axes), its parameters placed by the
    partition rules; the model's own parameters are left where they are."""
    from jaxrl_mt.sampling import Sampler

    return Sampler.from_model(model, mesh=_mesh(mesh_shape), max_batch=max_batch)


def load_tasks(sources: Sequence[str], *, task: str = "math", limit: int = 0,
               seen: dict[str, str] | None = None) -> list[ShardedTask]:
    """The instructions of every source (all of task ``task``), each checked for what its verifier needs.

    Args:
      sources: source specs (a ``lic:FILE`` without task loads ``task``).
      task: the LiC task the sources hold.
      limit: at most this many instructions per source (0: all).
      seen: task id -> source of instructions loaded before (duplicates across calls are refused).

    Raises:
      EvalError: a duplicate task id, another task's instruction, a math answer without a number,
        a code task without tests (naming the source and task id); DataError from the loaders
        names file, line and field.
    """
    out: list[ShardedTask] = []
    seen = {} if seen is None else seen
    for spec in sources:
        tasks = load_source(with_task(spec, task))
        for t in tasks[: limit or None]:
            if t.task_id in seen:
                raise EvalError(f"source {spec!r}: duplicate task id {t.task_id!r} (also in {seen[t.task_id]!r})")
            if "|" in t.task_id:
                raise EvalError(f"source {spec!r}: task {t.task_id!r}: field 'task_id' must not contain '|'")
            check_record(t, task, spec)
            if task == "math":
                try:
                    verify("", t.answer)
                except ValueError:
                    raise EvalError(f"source {spec!r}: task {t.task_id!r}: field 'answer': {t.answer!r} holds no "
                                    "number") from None
            seen[t.task_id] = spec
            out.append(t)
    if not out:
        raise EvalError(f"config field 'dataset': no {task} instructions in {list(sources)}")
    return out


def load_eval_model(spec: str, *, dtype: str = "float32", attention: str = "auto") -> Any:
    """A registry Model for a model spec; ``workdir:PATH`` loads a training checkpoint's policy;
    ``attention``: the implementation of every forward (``models.attention.IMPLS``)."""
    if spec.startswith("workdir:"):  # the checkpoint loader alone: `import jaxrl_mt.rl.loop` stays out
        from jaxrl_mt.rl.policy_io import load_policy

        return load_policy(spec.split(":", 1)[1], attention=attention)
    from jaxrl_mt.models.registry import load_model

    return load_model(spec, param_dtype=dtype, dtype=dtype, attention=attention)


def _check_workdir(workdir: Path, c: EvalConfig) -> None:
    """Refuses to resume transcripts written under different results-defining fields."""
    want = json.loads(json.dumps({k: getattr(c, k) for k in RESULT_FIELDS}))
    path = workdir / RUN_CONFIG
    if path.exists() and (workdir / TRANSCRIPTS).exists():
        have = json.loads(path.read_text(encoding="utf-8"))
        for k in RESULT_FIELDS:
            if have.get(k, RESULT_DEFAULTS.get(k)) != want[k]:
                raise EvalError(f"{path}: field '{k}': the transcripts there were made with {have.get(k)!r}, "
                                f"this run has {want[k]!r}; use another workdir")
    check_writable_dir(workdir, "config field 'workdir':")  # OSError: one line, exit 2
    kept = want if is_http(c.model) else {**want, **attention_record(c.attention)}  # JAXRL_MT_ATTENTION too
    path.write_text(json.dumps(kept, indent=2) + "\n", encoding="utf-8")


def _run_todo(c: EvalConfig, todo: list[Any], store: TranscriptStore | None, plugins: dict[str, Any], *,
              model: Any, sampler: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Simulates the conversations not yet in ``store`` (appending each as it finishes; None: keeps
    nothing, a process other than 0 of a multi-process run) and returns
    this invocation's statistics (new tokens, judge, graders, endpoint and user-simulator counters)."""
    t0 = time.perf_counter()
    from jaxrl_mt.eval.user_sim import make_user
    from jaxrl_mt.sampling import SamplingConfig

    if model is None and sampler is None:
        if is_http(c.model):
            from jaxrl_mt.eval.http_assistant import remote_sampler

            sampler = remote_sampler(c.model, c.http)
        else:
            model = load_eval_model(c.model, dtype=c.dtype, attention=c.attention)
    if model is not None and c.enable_thinking is not None:  # Qwen3's thinking / no-think renderings
        try:
            tok = with_template_options(model.tokenizer, enable_thinking=c.enable_thinking)
        except ChatError as e:
            raise EvalError(f"config field 'enable_thinking': {e}") from None
        model = dataclasses.replace(model, tokenizer=tok)
    sampler = sampler if sampler is not None else make_sampler(model, c.mesh_shape, c.max_batch)
    judge = make_judge(c.judge, model=model, max_new_tokens=c.judge_max_new_tokens,
                       **http_backend_kw(c.judge, c.http))
    for plug in plugins.values():
        plug.backend = judge.backend
    user = make_user(c.user_simulator, model=model, max_new_tokens=c.user_max_new_tokens,
                     temperature=c.user_temperature, **http_backend_kw(c.user_simulator, c.http))
    sampling = SamplingConfig(max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p)
    written = [0]

    def sink(recs: list[dict[str, Any]]) -> None:
        if store is not None:
            store.append(recs)
        written[0] += len(recs)

    def progress(k: int, n: int) -> None:
        log(f"turn {k + 1}: {n} active conversations, {written[0]}/{len(todo)} finished, "
            f"{time.perf_counter() - t0:.0f}s")

    if isinstance(sampler, RemoteSampler):  # a model behind an endpoint
        from jaxrl_mt.eval.http_assistant import simulate_remote

        recs = simulate_remote(sampler, todo, sampling, judge=judge, protocol=c.protocol,
                               verifier_mode=c.verifier_mode, user=user, seed=c.seed, sink=sink,
                               progress=progress, tasks=plugins or None)
    else:
        recs = simulate(sampler, todo, sampling, judge=judge, protocol=c.protocol,
                        verifier_mode=c.verifier_mode, user=user, seed=c.seed, strategy=c.strategy,
                        sink=sink, progress=progress, max_chunk_cells=c.max_chunk_cells,
                        reuse_cache=c.reuse_cache, tasks=plugins or None)
    stats: dict[str, Any] = {"new_tokens": int(sum(t["new_tokens"] for r in recs for t in r["turns"])),
                             "judge": dict(judge.stats)}
    if plugins:
        stats["graded"] = {k: dict(p.stats) for k, p in plugins.items()}
    if isinstance(sampler, Sampler):  # in process: what its generate_ids calls executed (`sampling.counters`)
        stats["decode"] = utilisation(sampler.totals)
    if isinstance(sampler, RemoteSampler):
        stats["assistant_http"] = sampler.summary()  # requests, retries, failures
    if hasattr(user, "summary"):
        stats["user_sim"] = user.summary()
    return stats


def evaluate(cfg: Any, *, model: Any = None, sampler: Any = None,
             log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs (or resumes) an evaluation and writes its outputs, holding the workdir's lock
    (``workdir_lock``: a second live evaluation or trainer there is refused naming its pid).

    Args:
      cfg: the config (see ``configs/eval_lic.py``).
      model: an already loaded Model to evaluate instead of loading ``cfg.model``.
      sampler: a ready Sampler of that model (default: :func:`make_sampler` with the config's
        ``mesh_shape`` and ``max_batch``).
      log: progress messages (default: stderr).

    Returns:
      ``{"report", "files", "n_planned", "n_resumed", "n_generated", "seconds"}``.
    """
    from jaxrl_mt.parallel import is_main_process, maybe_initialize_distributed

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    maybe_initialize_distributed()  # first: checking the config's mesh lists the devices, which initialises JAX
    c = normalize_config(cfg)
    if is_main_process():
        check_writable_dir(c.workdir, "config field 'workdir':")  # OSError: one line, exit 2
    with hold_workdir(c.workdir, what="evaluation", log=log, enabled=is_main_process()):
        return _evaluate(c, model=model, sampler=sampler, log=log)


def _evaluate(c: EvalConfig, *, model: Any, sampler: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """``evaluate`` under the workdir's lock."""
    from jaxrl_mt.parallel import broadcast_json, is_main_process, maybe_initialize_distributed

    multi = maybe_initialize_distributed()  # several processes: every one simulates every conversation
    main = is_main_process()  # (replicated rows on the global mesh); process 0 alone writes the workdir
    seen: dict[str, str] = {}
    tasks = [t for name, specs in c.sources.items()
             for t in load_tasks(specs, task=name, limit=c.limit, seen=seen)]
    plugins = judged_plugins(c.tasks, max_new_tokens=c.judge_max_new_tokens)  # backend set below

    def system(t: ShardedTask) -> str | None:
        s = conversation_system(t, c.system_prompt or None, plugins)
        return with_abstain(s) if c.abstain else s  # "+ Abstain": the same instruction for every task

    runs, skipped = plan_runs(tasks, c.scenarios, c.runs, seed=c.seed, system=system,
                              shuffle=c.shuffle_shards)
    for s in skipped:
        log(f"skipping {s['kind']} for {s['task_id']}: {s['reason']}")
    workdir = Path(c.workdir)
    if main:
        _check_workdir(workdir, c)
    store = TranscriptStore(workdir / TRANSCRIPTS)
    done = set(store.load()) if main else set()
    if multi:  # the same conversations on every process (process 0's store decides)
        done = set(broadcast_json(sorted(done)))
    todo = [r for r in runs if r.conv_id not in done]
    log(f"{len(tasks)} instructions, {len(c.scenarios)} scenarios, {len(runs)} conversations "
        f"({len(runs) - len(todo)} already in {store.path})")
    t0 = time.perf_counter()
    stats: dict[str, Any] = {}
    if todo:
        stats = _run_todo(c, todo, store if main else None, plugins, model=model, sampler=sampler, log=log)
    seconds = time.perf_counter() - t0
    if not main:
        return {"report": None, "files": {}, "n_planned": len(runs), "n_resumed": len(runs) - len(todo),
                "n_generated": len(todo), "seconds": seconds}
    planned = {r.conv_id for r in runs}
    records = [r for cid, r in store.load().items() if cid in planned]
    missing = planned - {r["conv_id"] for r in records}
    if missing:
        raise EvalError(f"{store.path}: {len(missing)} planned conversations have no transcript, "
                        f"e.g. {sorted(missing)[0]!r}")
    extra = {"model": c.model, "config": c.to_dict(), "skipped": skipped,
             "this_invocation": {"n_generated": len(todo), "seconds": seconds, **stats}}
    report = build_report(records, scenarios=c.scenarios, protocol=c.protocol, n_boot=c.bootstrap,
                          seed=c.seed, extra=extra)
    files = write_report(report, workdir, plots=c.plots, records=records)
    for w in report["warnings"]:
        log(f"WARNING: {w}")
    log(f"wrote {', '.join(str(p) for p in files.values())}")
    return {"report": report, "files": files, "n_planned": len(runs), "n_resumed": len(runs) - len(todo),
            "n_generated": len(todo), "seconds": seconds}


def main(argv: Sequence[str]) -> None:
    from absl import app

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    cfg = config_value(_CONFIG)
    if cfg is None:
        raise app.UsageError("--config is required, e.g. --config configs/eval_lic.py:cpu")
    try:
        result = evaluate(cfg)
    except (EvalError, DataError, ModelError, BackendError, OSError) as e:  # OSError: an unwritable workdir
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    if result["files"]:  # process 0 (the others write nothing)
        print((Path(result["files"]["report.md"])).read_text(encoding="utf-8"))


if __name__ == "__main__":
    from absl import app
    from ml_collections import config_flags

    _CONFIG = config_flags.DEFINE_config_file("config", None, "evaluation config file[:preset]", lock_config=True)
    app.run(main, flags_parser=parse_flags)

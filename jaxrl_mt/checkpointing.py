"""Orbax checkpoints of a training run: one directory per step.

Each step directory holds two items written by one ``orbax.checkpoint.CheckpointManager``:

* ``state``: a pytree of arrays (params, optimizer state, step counter, RNG key, ...) saved with
  ``StandardSave`` (tensorstore/OCDBT; sharded arrays are written shard by shard);
* ``extra``: a JSON document (data-iterator state, metrics so far, config) saved with ``JsonSave``.

Crash safety is orbax's: a step is written into ``<step>.orbax-checkpoint-tmp*`` and renamed to
``<step>`` only when every item is complete, so a kill mid-save leaves a temporary directory that
``latest_step`` and ``restore`` never see; a writable ``Checkpointer`` deletes such leftovers
in the background when it is opened (orbax's ``cleanup_tmp_directories``; finished before its
first save), a ``read_only`` one leaves them alone. Saves are asynchronous: ``save`` returns once
arrays are copied to host memory; call ``wait`` before reading the files from another process and ``close`` at the end.

Faults, each reported in one line (a ``CheckpointError``), never a page of orbax tracebacks:

* a damaged finalised step (truncated or deleted files): ``restore()`` of the latest step falls back
  to the newest step that restores, reports each skipped step and why (one line each; orbax's own
  log records of it deduplicated), and (writable) renames it ``<step>.unrestorable`` so
  that the run can save that step again; only later steps are lost. Those folders count against
  ``max_to_keep``: a save that would leave more steps and unrestorable folders than that removes
  the oldest unrestorable ones;
* too little free space: ``save`` compares the step's size (estimated from the pytree) with the free
  space before it starts and refuses; nothing is written, earlier steps are kept;
* an asynchronous save that fails later (a disk filled by someone else): the next ``save``, ``wait``
  or ``close`` raises, naming the step and the cause; orbax's logged tracebacks of it are dropped,
  the half-written step is removed, earlier steps are kept.

Size exception: one class owns the save and restore paths and each of their faults above.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from typing import Any, Callable, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

PyTree = Any

_STATE = "state"
_EXTRA = "extra"
UNRESTORABLE = "unrestorable"  # a skipped step directory is renamed to "<step>.unrestorable"
_log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message is one line naming step, folder and cause."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


def short_reason(e: BaseException, root: epath.Path | str | None = None, limit: int = 240) -> str:
    """One line naming an exception's cause: ``ValueError: OUT_OF_RANGE: ... 2/state/d/7819...``.

    Paths under ``root`` are shown relative to it, tensorstore's specs (hundreds of characters of
    JSON) are cut, a full disk is named as such, long messages are shortened.
    """
    msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    if "RESOURCE_EXHAUSTED" in msg or "No space left" in msg or getattr(e, "errno", None) == 28:
        return "No space left on device"
    msg = " ".join(msg.split(" [tensorstore_spec=")[0].split())
    if root is not None:
        msg = msg.replace(str(root).rstrip("/") + "/", "")
    if len(msg) > limit:
        msg = msg[: limit - 3] + "..."
    return f"{type(e).__name__}: {msg}"


def free_bytes(directory: epath.Path | str) -> int | None:
    """Free bytes on the file system holding ``directory`` (None for remote storage)."""
    if "://" in str(directory):
        return None
    return shutil.disk_usage(str(directory)).free


def estimate_bytes(state: PyTree, extra: dict[str, Any]) -> int:
    """An upper estimate of a checkpoint's size on disk: the arrays' bytes plus metadata."""
    leaves = jax.tree.leaves(state)
    data = 0
    for x in leaves:
        dtype = getattr(x, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        data += int(getattr(x, "nbytes", 8))
    return int(data * 1.02) + 512 * len(leaves) + len(json.dumps(extra)) + 64 * 1024


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


class _DropOrbaxSaveTracebacks(logging.Filter):
    """Drops orbax's ERROR records (with tracebacks) of a failed background save: the
    ``Checkpointer`` raises the failure itself, as one line."""

    PATTERNS = ("_SignalingThread.run() raised an exception", "in background save thread",
                "Save Finalize thread (%s) failed")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not ("orbax" in record.pathname and record.levelno >= logging.ERROR
                    and any(p in msg for p in self.PATTERNS))


_ORBAX_FILTER = _DropOrbaxSaveTracebacks()


class _OrbaxOnce(logging.Filter):
    """Lets each distinct orbax warning or error through once: orbax logs the same record of a damaged
    step every time it reads the step's metadata (listing steps, restoring, falling back)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if "orbax" not in record.pathname or record.levelno < logging.WARNING:
            return True
        key = (record.levelno, record.getMessage()[:500])
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


_ORBAX_ONCE = _OrbaxOnce()


@contextlib.contextmanager
def _no_closed_loop_reports() -> Iterator[None]:
    """While a damaged step is read, tensorstore reports one ``Event loop is closed`` traceback
    per array whose read was still pending when the first one failed; those are dropped."""
    old = sys.unraisablehook

    def hook(u: Any) -> None:
        if not (isinstance(u.exc_value, RuntimeError) and "Event loop is closed" in str(u.exc_value)):
            old(u)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = old


def _path_str(path: tuple[Any, ...]) -> str:
    """A readable, container-independent key path: ``opt_state/0/mu/w``."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def check_writable(directory: epath.Path | str) -> None:
    """Creates ``directory`` and writes a probe file in it; raises OSError naming the path."""
    if "://" in str(directory):  # remote storage (gs://...): orbax reports its own errors
        return
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-probe-"):
            pass
    except OSError as e:
        raise OSError(f"Checkpointer: checkpoint directory {directory} is not writable: {e.strerror or e}") from e


class Checkpointer:
    """Saves and restores ``(state pytree, JSON extra)`` pairs, one orbax directory per step."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_to_keep: int = 3,
        save_interval_steps: int = 1,
        read_only: bool = False,
    ):
        """Opens (and creates) a checkpoint directory.

        Args:
          directory: root directory; steps live in ``<directory>/<step>``. Local paths are made
            absolute; ``gs://`` and other epath URLs are passed to orbax as they are.
          max_to_keep: keep only the newest this many steps (older ones are deleted on save).
          save_interval_steps: ``save`` writes only steps that are multiples of this (unless
            ``force``).
          read_only: open for restoring only (e.g. an evaluator next to a running trainer):
            nothing is written or deleted, leftover temporary directories are left alone.

        Raises:
          ValueError: for ``max_to_keep < 1`` or ``save_interval_steps < 1``.
          OSError: if the directory cannot be created or written (naming the path).
          FileNotFoundError: if ``read_only`` and the directory does not exist.
        """
        if max_to_keep < 1:
            raise ValueError(f"Checkpointer: max_to_keep={max_to_keep} must be >= 1")
        if save_interval_steps < 1:
            raise ValueError(f"Checkpointer: save_interval_steps={save_interval_steps} must be >= 1")
        path = str(directory)
        self.directory = epath.Path(path if "://" in path else os.path.abspath(path))
        if read_only:
            if not self.directory.exists():
                raise FileNotFoundError(f"Checkpointer: checkpoint directory {self.directory} does not exist")
        else:
            check_writable(self.directory)
        options = ocp.CheckpointManagerOptions(
            save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(save_interval_steps),
            preservation_policy=ocp.checkpoint_managers.LatestN(n=max_to_keep),
            create=not read_only,
            cleanup_tmp_directories=not read_only,
            read_only=read_only,
        )
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={_STATE: ocp.StandardCheckpointHandler(), _EXTRA: ocp.JsonCheckpointHandler()},
        )
        self.read_only = read_only
        self.max_to_keep = max_to_keep
        self._pending: int | None = None  # the step of the asynchronous save in flight
        absl_logger = logging.getLogger("absl")
        for f in (_ORBAX_FILTER, _ORBAX_ONCE):
            if f not in absl_logger.filters:
                absl_logger.addFilter(f)

    def save(self, step: int, state: PyTree, extra: dict[str, Any], *, force: bool = False) -> bool:
        """Starts saving ``state`` and ``extra`` as ``step`` (asynchronously).

        Args:
          step: the training step (the directory name).
          state: pytree of ``jax.Array`` / NumPy arrays / scalars (params, optimizer state, step,
            RNG key, ...). Sharded arrays are saved shard by shard.
          extra: JSON-serialisable dict (data iterator state, metrics, ...).
          force: save even if ``step`` is not a multiple of ``save_interval_steps``.

        Returns:
          True if a save was started, False if skipped by the interval policy.

        Raises:
          TypeError: if ``extra`` is not JSON-serialisable.
          ValueError: if ``step`` already exists.
          CheckpointError: too little free space for this step (nothing written), or the previous
            asynchronous save failed; earlier steps are kept.
        """
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as e:
            raise TypeError(f"Checkpointer.save: extra for step {step} is not JSON-serialisable: {e}") from e
        self.wait()  # a failure of the previous save surfaces here, naming its own step
        if step in self._manager.all_steps():
            raise ValueError(f"Checkpointer.save: step {step} already exists in {self.directory}")
        if not (force or self._manager.should_save(step)):
            return False
        self._check_free_space(step, state, extra)
        self._prune_unrestorable(self.max_to_keep - min(self.max_to_keep, len(self.all_steps()) + 1))
        with self._surfacing(step):
            self._pending = step
            return self._manager.save(
                step,
                args=ocp.args.Composite(**{_STATE: ocp.args.StandardSave(state), _EXTRA: ocp.args.JsonSave(extra)}),
                force=force,
            )

    def _check_free_space(self, step: int, state: PyTree, extra: dict[str, Any]) -> None:
        """CheckpointError when the file system has less free space than the step needs.

        Multi-process, process 0's verdict is everyone's (a collective save must not split).
        """
        need = estimate_bytes(state, extra)
        free = free_bytes(self.directory)
        short = free is not None and free < need
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            short = bool(multihost_utils.broadcast_one_to_all(np.asarray(short)))
        if short:
            latest = self.latest_step()
            raise CheckpointError(
                f"not enough free space in {self.directory} for checkpoint step {step}: about {_mb(need)} "
                f"needed, {_mb(free or 0)} free; nothing written, "
                + (f"the last checkpoint (step {latest}) is kept" if latest is not None else "no earlier checkpoint"))

    @contextlib.contextmanager
    def _surfacing(self, step: int | None) -> Iterator[None]:
        """Turns a failed save (the one in flight, else ``step``'s) into one CheckpointError."""
        try:
            yield
            if step is None:
                self._pending = None
        except Exception as e:
            failed = self._pending if self._pending is not None else step
            self._pending = None
            if jax.process_count() == 1:  # free the space of the half-written step
                for tmp in self.directory.glob(f"{failed}.orbax-checkpoint-tmp*"):
                    shutil.rmtree(str(tmp), ignore_errors=True)
            self._manager.reload()
            latest = self._manager.latest_step()
            why = short_reason(e, self.directory)
            raise CheckpointError(
                f"checkpoint step {failed} could not be written to {self.directory} ({why}); "
                + (f"the last checkpoint (step {latest}) is kept" if latest is not None else "no earlier checkpoint")
            ) from None

    def unrestorable(self) -> list[epath.Path]:
        """The ``<step>.unrestorable[-n]`` folders of skipped steps, oldest step first."""
        found = [p for p in self.directory.glob(f"*.{UNRESTORABLE}*") if p.name.split(".")[0].isdigit()]
        return sorted(found, key=lambda p: (int(p.name.split(".")[0]), len(p.name), p.name))

    def _prune_unrestorable(self, room: int) -> None:
        """Removes the oldest unrestorable folders beyond ``room`` (process 0; they count against max_to_keep)."""
        if jax.process_index() == 0:
            found = self.unrestorable()
            for p in found[: max(len(found) - room, 0)]:
                shutil.rmtree(str(p), ignore_errors=True)

    def all_steps(self) -> list[int]:
        """Finalised steps on disk, ascending."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest finalised step, or None when there is none."""
        return self._manager.latest_step()

    def restore(self, step: int | None = None, *, target: PyTree,
                on_skip: Callable[[str], None] | None = None,
                retired: tuple[str, ...] = ()) -> tuple[PyTree, dict[str, Any]]:
        """Restores a step into the structure of ``target``.

        Args:
          step: the step to restore; None: the newest step that restores. A damaged newer step
            (truncated or deleted files) is skipped with one line to ``on_skip`` naming it and
            why, and (writable checkpointer) renamed to ``<step>.unrestorable`` once an older step
            restored, so that the run can save that step again.
          target: a pytree with the saved structure whose leaves (``jax.Array`` or
            ``jax.ShapeDtypeStruct``, with shardings) give the shape, dtype and sharding of
            each restored array; values are not read.
          on_skip: receives the line of each skipped step (default: a logging warning).
          retired: top-level entries of a dict ``target`` that older checkpoints hold and the
            current state no longer has (e.g. the train state's former ``rng``): read when present
            and dropped, so that those checkpoints still restore.

        Returns:
          ``(state, extra)`` of the restored step (with a fallback: an older one than the latest);
          ``state`` has ``target``'s structure, dtypes and shardings.

        Raises:
          FileNotFoundError: if there is no such (finalised) step.
          ValueError: if ``target`` does not match the saved structure or shapes (listing the
            differing paths); a mismatch is not a damaged step, so there is no fallback.
          CheckpointError: the requested step (or, with ``step=None``, every step) does not restore.
        """
        self.wait()
        steps = self.all_steps()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        if step is not None:
            if step not in steps:
                raise FileNotFoundError(
                    f"Checkpointer.restore: no step {step} in {self.directory} (available: {steps})")
            return self._restore_step(step, abstract, retired)
        if not steps:
            raise FileNotFoundError(f"Checkpointer.restore: no checkpoint in {self.directory}")
        skipped: list[tuple[int, str]] = []
        for s in reversed(steps):
            try:
                out = self._restore_step(s, abstract, retired)
            except CheckpointError as e:
                skipped.append((s, e.reason))
                continue
            self._set_aside(s, skipped, on_skip or _log.warning)
            return out
        raise CheckpointError(f"no checkpoint in {self.directory} restores: "
                              + "; ".join(f"step {s}: {why}" for s, why in skipped))

    def _restore_step(self, step: int, abstract: PyTree,
                      retired: tuple[str, ...] = ()) -> tuple[PyTree, dict[str, Any]]:
        """One step; CheckpointError(message, reason) when its files are damaged."""
        with _no_closed_loop_reports():
            try:
                saved_tree = self._manager.item_metadata(step)[_STATE]
                if saved_tree is None:
                    raise FileNotFoundError(f"no '{_STATE}' item")
            except Exception as e:
                raise self._damaged(step, e) from None
            dropped = [k for k in retired if isinstance(abstract, dict) and k not in abstract
                       and hasattr(saved_tree, "keys") and k in saved_tree.keys()]
            if dropped:
                abstract = dict(abstract, **{k: jax.tree.map(
                    lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), saved_tree[k]) for k in dropped})
            self._check_structure(step, saved_tree, abstract)
            try:
                restored = self._manager.restore(
                    step,
                    args=ocp.args.Composite(
                        **{_STATE: ocp.args.StandardRestore(abstract), _EXTRA: ocp.args.JsonRestore()}
                    ),
                )
            except Exception as e:
                raise self._damaged(step, e) from None
        state = restored[_STATE]
        if dropped:
            state = {k: v for k, v in state.items() if k not in dropped}
        return state, restored[_EXTRA]

    def _damaged(self, step: int, e: Exception) -> CheckpointError:
        why = short_reason(e, self.directory)
        return CheckpointError(f"checkpoint step {step} in {self.directory} does not restore ({why})", why)

    def _set_aside(self, good: int, skipped: list[tuple[int, str]], report: Callable[[str], None]) -> None:
        """Reports each skipped step; a writable checkpointer renames them ``<step>.unrestorable``."""
        for s, why in skipped:
            line = f"checkpoint step {s} in {self.directory} does not restore ({why}); restored step {good} instead"
            if not self.read_only:
                dest = self.directory / f"{s}.{UNRESTORABLE}"
                n = 1
                while dest.exists():
                    n += 1
                    dest = self.directory / f"{s}.{UNRESTORABLE}-{n}"
                if jax.process_index() == 0:
                    (self.directory / str(s)).rename(dest)
                line += f", and moved step {s} to {dest}"
            report(line)
        if skipped and not self.read_only:
            if jax.process_count() > 1:
                ocp.multihost.sync_global_processes("jaxrl_mt_checkpoint_set_aside")
            self._manager.reload()

    def _check_structure(self, step: int, saved_tree: PyTree, abstract: PyTree) -> None:
        """Compares target key paths and shapes with the saved metadata; ValueError on mismatch."""
        saved = {_path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(saved_tree)[0]}
        wanted = {_path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]}
        problems = []
        missing = sorted(set(wanted) - set(saved))
        unexpected = sorted(set(saved) - set(wanted))
        if missing:
            problems.append(f"in target but not in checkpoint: {missing}")
        if unexpected:
            problems.append(f"in checkpoint but not in target: {unexpected}")
        for key in sorted(set(saved) & set(wanted)):
            want_dtype = getattr(wanted[key], "dtype", None)
            if want_dtype is not None and jax.dtypes.issubdtype(want_dtype, jax.dtypes.prng_key):
                continue  # typed keys are stored as their raw uint32 data
            want_shape = tuple(getattr(wanted[key], "shape", ()))
            saved_shape = tuple(getattr(saved[key], "shape", ()) or ())
            if want_shape != saved_shape:
                problems.append(f"{key}: checkpoint shape {saved_shape}, target shape {want_shape}")
        if problems:
            raise ValueError(
                f"Checkpointer.restore: target does not match {self.directory / str(step)}: " + "; ".join(problems)
            )

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are finalised on disk.

        Raises:
          CheckpointError: the save in flight failed (one line; earlier steps are kept).
        """
        with self._surfacing(None):
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager's resources.

        Raises:
          CheckpointError: the save in flight failed (the manager is closed all the same).
        """
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

PyTree = Any

_STATE = "state"
_EXTRA = "extra"


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
        """
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as e:
            raise TypeError(f"Checkpointer.save: extra for step {step} is not JSON-serialisable: {e}") from e
        if step in self._manager.all_steps():
            raise ValueError(f"Checkpointer.save: step {step} already exists in {self.directory}")
        return self._manager.save(
            step,
            args=ocp.args.Composite(**{_STATE: ocp.args.StandardSave(state), _EXTRA: ocp.args.JsonSave(extra)}),
            force=force,
        )

    def all_steps(self) -> list[int]:
        """Finalised steps on disk, ascending."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest finalised step, or None when there is none."""
        return self._manager.latest_step()

    def restore(self, step: int | None = None, *, target: PyTree) -> tuple[PyTree, dict[str, Any]]:
        """Restores a step into the structure of ``target``.

        Args:
          step: the step to restore; None: the latest.
          target: a pytree with the saved structure whose leaves (``jax.Array`` or
            ``jax.ShapeDtypeStruct``, with shardings) give the shape, dtype and sharding of
            each restored array; values are not read.

        Returns:
          ``(state, extra)``: ``state`` has ``target``'s structure, dtypes and shardings.

        Raises:
          FileNotFoundError: if there is no such (finalised) step.
          ValueError: if ``target`` does not match the saved structure or shapes (listing the
            differing paths).
        """
        self._manager.wait_until_finished()
        steps = self.all_steps()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"Checkpointer.restore: no checkpoint in {self.directory}")
        elif step not in steps:
            raise FileNotFoundError(
                f"Checkpointer.restore: no step {step} in {self.directory} (available: {steps})"
            )
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        self._check_structure(step, abstract)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardRestore(abstract), _EXTRA: ocp.args.JsonRestore()}
            ),
        )
        return restored[_STATE], restored[_EXTRA]

    def _check_structure(self, step: int, abstract: PyTree) -> None:
        """Compares target key paths and shapes with the saved metadata; ValueError on mismatch."""
        saved_tree = self._manager.item_metadata(step)[_STATE]
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
        """Blocks until pending asynchronous saves are finalised on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager's resources."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""grain input pipelines over in-memory records (tasks or scenarios).

``make_iterator`` builds ``MapDataset.source -> per-process shard -> shuffle -> repeat -> batch``
and returns grain's ``DatasetIterator``, whose ``get_state()`` / ``set_state()`` is a small
JSON-able dict: save it in the training checkpoint and a resumed run draws the identical next
batch. Shuffling is a pure function of ``seed`` and reshuffles every epoch; every process holds
the same number of records (the remainder after an even split is dropped), so all hosts of a
multi-host run take the same number of steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grain

from jaxrl_mt.data.records import DataError


def _as_list(batch: Sequence[Any]) -> list[Any]:
    return list(batch)


def make_dataset(
    records: Sequence,
    *,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_index: int = 0,
    shard_count: int = 1,
    drop_remainder: bool = True,
) -> grain.MapDataset:
    """The ``MapDataset`` behind :func:`make_iterator` (same arguments)."""
    if batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}")
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise DataError(f"need 0 <= shard_index < shard_count, got {shard_index} of {shard_count}")
    if num_epochs is not None and num_epochs < 1:
        raise DataError(f"num_epochs must be >= 1 or None, got {num_epochs}")
    records = list(records)
    per_process = len(records) // shard_count
    if per_process == 0:
        raise DataError(f"{len(records)} records cannot feed {shard_count} processes")
    if drop_remainder and per_process < batch_size:
        raise DataError(f"{per_process} records per process is less than one batch of {batch_size}")
    ds = grain.MapDataset.source(records[: per_process * shard_count])
    ds = ds[shard_index::shard_count]  # [per_process]
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)  # reshuffles each epoch
    return ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=_as_list)


def make_iterator(
    records: Sequence,
    *,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_index: int = 0,
    shard_count: int = 1,
    drop_remainder: bool = True,
) -> grain.DatasetIterator:
    """A checkpointable iterator of batches (lists of records).

    Args:
      records: the records (any Python objects).
      batch_size: records per batch (per process).
      seed: shuffle seed.
      shuffle: shuffle (reshuffled every epoch).
      num_epochs: passes over the data; ``None`` repeats forever.
      shard_index: this process's index (``jax.process_index()``).
      shard_count: number of processes (``jax.process_count()``).
      drop_remainder: drop the last partial batch.

    Returns:
      A grain ``DatasetIterator``; ``it.get_state()`` / ``it.set_state(state)`` checkpoint it.
    """
    ds = make_dataset(
        records,
        batch_size=batch_size,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        shard_index=shard_index,
        shard_count=shard_count,
        drop_remainder=drop_remainder,
    )
    # No prefetch threads: the records are in memory and a thread pool only costs CPU here.
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))

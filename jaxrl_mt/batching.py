"""Host-side batch shapes shared by the engine: buckets, chunk plans, row packing and seeds.

Every jitted engine function (the sampler's prefill and decode, the scorer, the train step) sees
padded batches whose shapes come from a few power-of-two buckets, so a run compiles a handful of
programs. The helpers that decide those shapes, pack variable-length rows into them and turn a
seed into a PRNG key live here, once, for the sampler, the scorer and the rollout
assembly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

SeedLike = Any  # an int seed or a jax PRNG key


def bucket(n: int, minimum: int) -> int:
    """The smallest power-of-two multiple of `minimum` that is >= n."""
    b = minimum
    while b < n:
        b *= 2
    return b


def fine_bucket(n: int, minimum: int, linear: int = 16) -> int:
    """The smallest multiple of `minimum` >= n up to `linear` multiples, then `bucket`'s powers of two:
    training rows padded by at most `minimum` - 1 tokens at the short lengths, at most 16 + log2 shapes."""
    if n <= minimum * linear:
        return minimum * max(1, -(-n // minimum))
    return bucket(n, minimum)


def plan_chunks(lengths: Sequence[int], max_batch: int | None, cells: Callable[[int, int], int] | None = None,
                max_cells: int | None = None) -> list[list[int]]:
    """Groups rows by ascending length into chunks of at most `max_batch` rows.

    Args:
      lengths: [B] length of each row (e.g. its first prompt).
      max_batch: rows per chunk (None: all).
      cells: optional cells(rows, longest) -> memory cells of a chunk; with `max_cells`, a chunk
        whose cells exceed max_cells gets fewer rows (halved to a power of two, at least 1).
      max_cells: the memory bound of one chunk, in cells.

    Returns:
      Lists of row indices, each sorted by length, chunks ordered by length.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    full = max_batch or max(len(order), 1)
    out: list[list[int]] = []
    i = 0
    while i < len(order):
        rows = min(full, len(order) - i)
        if cells is not None and max_cells is not None:
            while rows > 1 and cells(rows, lengths[order[i + rows - 1]]) > max_cells:
                rows = bucket(rows, 1) // 2
        out.append(order[i:i + rows])
        i += rows
    return out


def pack_rows(rows: Sequence[Sequence[int]], pad_id: int, width: int, *, align: str = "left",
              n_rows: int | None = None, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Packs variable-length id rows into a fixed [n_rows, width] array and its mask.

    Args:
      rows: the id rows.
      pad_id: the id of padding cells.
      width: columns of the result.
      align: "left" pads on the left (rows end at column `width`, as prompts for generation);
        "right" puts each row at column `offset` and pads after it.
      n_rows: rows of the result (default len(rows)); extra rows are all padding.
      offset: first column of every row when align == "right".

    Returns:
      ids [n_rows, width] int32 and mask [n_rows, width] bool (True on real ids).

    Raises:
      ValueError: a row that does not fit, or an unknown alignment.
    """
    if align not in ("left", "right"):
        raise ValueError(f"pack_rows: align must be 'left' or 'right', got {align!r}")
    n = len(rows) if n_rows is None else n_rows
    ids = np.full((n, width), pad_id, np.int32)
    mask = np.zeros((n, width), bool)
    for i, r in enumerate(rows):
        k = len(r)
        start = width - k if align == "left" else offset
        if start < 0 or start + k > width:
            raise ValueError(f"row {i}: {k} ids do not fit {width} columns (offset {offset}, align {align})")
        ids[i, start:start + k] = r
        mask[i, start:start + k] = True
    return ids, mask


def as_key(seed: SeedLike) -> Any:
    """A PRNG key from an int seed (`jax.random.PRNGKey`); a key is returned as it is."""
    import jax

    return jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed

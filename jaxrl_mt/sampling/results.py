"""What a generation call returns, and the per-row stop-id array of the kernels."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass
class GenerationResult:
    """Per-row outputs, trimmed to each row's length."""

    tokens: list[list[int]]  # generated ids, stop token included when one ended the row
    logprobs: list[np.ndarray]  # [len] log-probs of the generated ids
    lengths: np.ndarray  # [B] number of generated ids
    finish_reasons: list[str]  # "stop" | "length"
    texts: list[str] | None = None  # decoded, stop token excluded
    stats: dict[str, float] = dataclasses.field(default_factory=dict)


def stop_array(stops: Sequence[Sequence[int]], rows: int) -> np.ndarray:
    """Stop ids [rows, E] (-1 = unused) from per-row lists (rows beyond the lists get none)."""
    width = max(1, max((len(s) for s in stops), default=0))
    arr = np.full((rows, width), -1, np.int32)
    for i, s in enumerate(stops):
        arr[i, : len(s)] = s
    return arr

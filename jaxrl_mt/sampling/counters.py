"""What a decode call executed against what it needed: row-steps, cache slots read, their live shares.

A decode loop runs every row of its batch (padding and finished rows included) until its longest
row is done, and each step's attention reads a prefix of the cache (`models.cache_attention`:
the first static bucket covering the write index). These counters are computed on the host from
the call's shape and its rows' lengths, with the kernels' own rules, so a benchmark or an
evaluation can report its utilisation without timing anything:

  * ``row_steps``: rows x decode steps executed (the first token of a row comes from the prefill);
  * ``live_row_steps``: the row-steps that fed a token of a row still generating;
  * ``slots_read``: cache slots read by the attention, summed over rows and steps (per layer);
  * ``live_slots``: of those, the slots holding a live row's context (its prompt and tokens so far).

``row_utilisation`` = live_row_steps / row_steps and ``slot_utilisation`` = live_slots / slots_read.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxrl_mt.models.cache_attention import prefix_buckets

KEYS = ("row_steps", "live_row_steps", "slots_read", "live_slots")


def decode_counters(prompt_lens: Sequence[int], lengths: Sequence[int], *, rows: int, prompt_bucket: int,
                    new_bucket: int) -> dict[str, int]:
    """The counters of one `generate_tokens` call.

    Args:
      prompt_lens: [b] real prompt tokens of the call's real rows; lengths: [b] tokens each generated.
      rows: the call's row bucket (>= b: padding rows run too); prompt_bucket: P, the padded prompt
        width; new_bucket: N, the output buffer (the cache holds P + N slots).

    Returns:
      {row_steps, live_row_steps, slots_read, live_slots} (ints).
    """
    plen, n = np.asarray(prompt_lens, np.int64), np.asarray(lengths, np.int64)
    steps = int(n.max()) - 1 if n.size else 0  # loop iterations after the prefill's first token
    if steps <= 0:
        return dict.fromkeys(KEYS, 0)
    buckets = np.asarray(prefix_buckets(prompt_bucket + new_bucket))
    idx = prompt_bucket + np.arange(steps)  # the cache's write index at each step
    read = buckets[np.searchsorted(buckets, idx, side="left").clip(max=len(buckets) - 1)]
    live = np.arange(steps)[None] < (n - 1)[:, None]  # [b, steps]: row r feeds token j+1 at step j
    context = plen[:, None] + np.arange(steps)[None]  # its cached tokens then (prompt + tokens fed before)
    return {"row_steps": rows * steps, "live_row_steps": int(live.sum()), "slots_read": int(rows * read.sum()),
            "live_slots": int((context * live).sum())}


def add_counters(total: dict[str, int], part: dict[str, int]) -> dict[str, int]:
    """Sums two counter dicts."""
    return {k: total.get(k, 0) + part.get(k, 0) for k in KEYS}


def utilisation(counters: dict[str, int]) -> dict[str, float]:
    """The counters with their ratios: row_utilisation and slot_utilisation (1.0 for an empty call)."""
    out: dict[str, float] = {k: float(counters.get(k, 0)) for k in KEYS}
    out["row_utilisation"] = out["live_row_steps"] / out["row_steps"] if out["row_steps"] else 1.0
    out["slot_utilisation"] = out["live_slots"] / out["slots_read"] if out["slots_read"] else 1.0
    return out

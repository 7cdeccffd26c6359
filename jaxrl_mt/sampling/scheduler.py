"""The slot engine's host side: which waiting rows enter which free slots, and when the slots narrow.

`run_slots` drives the device programs of `sampling.slots` for one call of R rows: it admits the
longest waiting prompts first (each admission prefills at its own prompts' bucket, so a short
prompt is not padded to the call's longest), runs decode segments that return once an eighth of
the slots is free, collects finished rows, and, once no row waits, gathers the live slots into a
state an eighth of W narrower or more (`compact`), so the tail of a call runs at about the width
of its live rows. A GRPO group's G rows enter together and share one prefill. Shapes are
bucketed: admissions of a power of two of rows, at least W / 8; slot widths `slot_widths(W)`
(multiples of W / 8, powers of two below); prompt buckets as the engine's.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.batching import bucket
from jaxrl_mt.chat import left_pad
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.sampling.kernels import Method, Rows, row_keys
from jaxrl_mt.sampling.methods import RowParams
from jaxrl_mt.sampling.slots import STAT_KEYS, SlotState, admit, compact, empty_slots, segment


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def slot_widths(most: int) -> tuple[int, ...]:
    """The widths a call's slots take, ascending: multiples of W / 8 up to W, powers of two below it
    (a compiled segment program each; the tail narrows by an eighth of W at a time)."""
    step = max(1, most // 8)
    return tuple(sorted({step * k for k in range(1, most // step + 1)} | {1 << i for i in range(step.bit_length())
                                                                          if 1 << i < step} | {most}))


def _fit(widths: tuple[int, ...], n: int) -> int:
    """The narrowest width holding n rows."""
    return next(w for w in widths if w >= n)


class _Call:
    """The constants of one `run_slots` call (rows R = U x G: row i continues prompt i // G)."""

    def __init__(self, prompts, budgets, stops, row_params, keys, group, pad_id, min_prompt_bucket, prompt_bucket):
        self.prompts, self.budgets, self.stops = prompts, np.asarray(budgets, np.int32), np.asarray(stops, np.int32)
        self.row_params = jax.tree_util.tree_map(np.asarray, row_params)
        self.keys, self.group, self.pad_id = keys, group, pad_id
        self.min_prompt_bucket, self.prompt_bucket = min_prompt_bucket, prompt_bucket

    def admission(self, units: list[int], free: list[int], width: int) -> tuple[Any, ...]:
        """The arguments of `admit` for prompts `units` into the first slots of `free`."""
        g = self.group
        rows = [u * g + j for u in units for j in range(g)]
        n = len(rows)
        nb = min(width, _pow2(max(n, width // 8, 1)))
        ub = nb if g == 1 else _pow2(len(units))  # one row per prompt: the admission's own bucket
        p = min(bucket(max(len(self.prompts[u]) for u in units), self.min_prompt_bucket), self.prompt_bucket)
        tokens, mask = left_pad([list(self.prompts[u]) for u in units] + [[self.pad_id]] * (ub - len(units)),
                                self.pad_id, p)
        slots = np.full(nb, width, np.int32)  # padding rows: out of range, dropped
        slots[:n] = free[:n]
        source = np.zeros(nb, np.int32)
        source[:n] = np.repeat(np.arange(len(units), dtype=np.int32), g)
        pick = np.asarray(rows + [rows[0]] * (nb - n))
        plen = np.asarray([len(self.prompts[r // g]) for r in pick], np.int32)
        rp = jax.tree_util.tree_map(lambda x: jnp.asarray(x[pick]), self.row_params)
        consts = Rows(jnp.asarray(plen), jnp.asarray(self.stops[pick]), jnp.asarray(self.budgets[pick]), rp,
                      jnp.asarray(self.keys[pick]), jnp.zeros(nb, jnp.int32))
        return rows, (jnp.asarray(slots), jnp.asarray(tokens), jnp.asarray(mask), consts, jnp.asarray(source)), \
            ("admit", ub, nb, p)


def run_slots(params: Params, cfg: ModelConfig, prompts: Sequence[Sequence[int]], budgets: np.ndarray,
              stops: np.ndarray, row_params: RowParams, key: jax.Array, row_seeds: np.ndarray, *, method: Method,
              pad_id: int, width: int, steps: int, prompt_bucket: int, max_new: int, group: int = 1,
              min_prompt_bucket: int = 32, on_shape: Callable[[tuple[Any, ...]], None] | None = None,
              mesh: Any = None) -> dict[str, Any]:
    """Generates every row through W slots (see the module doc).

    Args:
      prompts: U token-id prompts; group: G rows per prompt (R = U x G rows, row i continues prompt
        i // G, the G rows of a prompt admitted together, one prefill).
      budgets: [R]; stops: [R, E]; row_params: [R] values; key: the call's PRNG key;
      row_seeds: [R] (row r draws its t-th token with fold_in(fold_in(key, seed_r), t)).
      width: W (>= G); steps: K, decode steps per segment; prompt_bucket: the widest prompt bucket
        (slots hold prompt_bucket + max_new cache slots); max_new: the output buffer;
      min_prompt_bucket: the smallest admission bucket; on_shape: called with each program shape run.
      mesh: a mesh within this process: the slots split over its (data, fsdp) axes (W and every
        width a multiple of their size), the caches by `parallel.CACHE_RULES`.

    Returns:
      {tokens [R, max_new], logprobs, lengths [R], finish [R], counters {segments, admissions,
      compactions, and `STAT_KEYS` summed}}.
    """
    g, n_rows = group, len(prompts) * group
    if width < g:
        raise ValueError(f"{width} slots cannot hold a group of {g} rows")
    keys = np.asarray(row_keys(key, jnp.asarray(row_seeds, jnp.uint32), n_rows))
    call = _Call(prompts, budgets, stops, row_params, keys, g, pad_id, min_prompt_bucket, prompt_bucket)
    note = on_shape or (lambda shape: None)
    from jaxrl_mt.parallel import row_shards

    m = row_shards(mesh)
    if width % m:
        raise ValueError(f"{width} slots do not split over the mesh's {m} row shards")
    widths = tuple(w for w in slot_widths(width) if w % m == 0)
    start = _fit(widths, min(n_rows, width))
    state = empty_slots(cfg, start, prompt_bucket + max_new, max_new, stops.shape[1], mesh)
    owner = np.full(start, -1)  # row held by each slot
    out = {"tokens": np.zeros((n_rows, max_new), np.int32), "logprobs": np.zeros((n_rows, max_new), np.float32),
           "lengths": np.zeros(n_rows, np.int32), "finish": np.zeros(n_rows, np.int32)}
    counters = dict.fromkeys(("segments", "admissions", "compactions") + STAT_KEYS, 0)
    waiting = sorted(range(len(prompts)), key=lambda u: -len(prompts[u]))  # longest first (stable)
    done = 0
    while done < n_rows:
        free = [i for i in range(len(owner)) if owner[i] < 0]
        take = waiting[: len(free) // g]
        if take:
            rows, args, shape = call.admission(take, free, len(owner))
            state = admit(params, cfg, state, *args, method=method, mesh=mesh)
            note(shape)
            owner[free[: len(rows)]] = rows
            waiting, counters["admissions"] = waiting[len(take):], counters["admissions"] + 1
        w = len(owner)
        n_free = int((owner < 0).sum())
        narrower = max([x for x in widths if x < w], default=0)
        min_free = max(w // 8, g, n_free + 1) if waiting else w - narrower
        state, stats = segment(params, cfg, state, jnp.int32(min_free), method=method, steps=steps, mesh=mesh)
        note(("segment", w, int(state.cache.valid.shape[1]), max_new))
        counters["segments"] += 1
        for k, v in zip(STAT_KEYS, np.asarray(stats).tolist()):
            counters[k] += int(v)
        done += _collect(state, owner, out)
        live = int((owner >= 0).sum())
        if not waiting and 0 < live <= narrower:
            state, owner = _narrow(state, owner, _fit(widths, live), mesh)
            counters["compactions"] += 1
    return {**out, "counters": counters}


def _collect(state: SlotState, owner: np.ndarray, out: dict[str, np.ndarray]) -> int:
    """Moves the rows that ended into `out` and frees their slots; returns how many."""
    live = np.asarray(state.live)
    ended = [i for i in range(len(owner)) if owner[i] >= 0 and not live[i]]
    if ended:
        toks, lps, count, fin = (np.asarray(x) for x in (state.tokens, state.logprobs, state.count, state.finish))
        for i in ended:
            r = owner[i]
            out["tokens"][r], out["logprobs"][r] = toks[i], lps[i]
            out["lengths"][r], out["finish"][r] = count[i], fin[i]
            owner[i] = -1
    return len(ended)


def _narrow(state: SlotState, owner: np.ndarray, width: int, mesh: Any) -> tuple[SlotState, np.ndarray]:
    """The held slots gathered into a state of `width` slots (the rest: free slots)."""
    held = [i for i in range(len(owner)) if owner[i] >= 0]
    keep = held + [i for i in range(len(owner)) if owner[i] < 0][: width - len(held)]
    return compact(state, jnp.asarray(keep, jnp.int32), mesh=mesh), owner[keep]

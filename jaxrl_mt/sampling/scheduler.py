"""The slot engine's host side: which waiting rows enter which free slots, and when the slots narrow.

`run_slots` drives the device programs of `sampling.slots` for one call of R rows: it admits the
longest waiting prompts first (each admission prefills at its own prompts' bucket, so a short
prompt is not padded to the call's longest), runs decode segments that return once an eighth of
the slots is free, collects finished rows, and, once no row waits, gathers the live slots into a
state an eighth of W narrower or more (`compact`), so the tail of a call runs at about the width
of its live rows. A GRPO group's G rows enter together, share one prefill and one stored copy of
their prompt, read once per step (`models.prefix_attention`). Shapes are bucketed: admissions of
a power of two of rows, at least W / 8; slot widths `slot_widths(W)` (multiples of W / 8, powers
of two below); prompt buckets as the engine's.
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
from jaxrl_mt.sampling.multiprocess import Transfers
from jaxrl_mt.sampling.slots import STAT_KEYS, SlotState, admit, admit_shared, compact, empty_slots, segment


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

    def __init__(self, prompts, budgets, stops, row_params, keys, group, pad_id, min_prompt_bucket, prompt_bucket,
                 io: Transfers):
        self.prompts, self.budgets, self.stops = prompts, np.asarray(budgets, np.int32), np.asarray(stops, np.int32)
        self.row_params = jax.tree_util.tree_map(np.asarray, row_params)
        self.keys, self.group, self.pad_id, self.io = keys, group, pad_id, io
        self.min_prompt_bucket, self.prompt_bucket = min_prompt_bucket, prompt_bucket

    def admission(self, units: list[int], free: list[int], width: int) -> tuple[Any, ...]:
        """The arguments of `admit` for prompts `units` into the first slots of `free`."""
        g = self.group
        rows = [u * g + j for u in units for j in range(g)]
        n = len(rows)
        nb = min(width, bucket(max(n, width // 8, 1), 1))
        ub = nb if g == 1 else bucket(len(units), 1)  # one row per prompt: the admission's own bucket
        p = min(bucket(max(len(self.prompts[u]) for u in units), self.min_prompt_bucket), self.prompt_bucket)
        tokens, mask = left_pad([list(self.prompts[u]) for u in units] + [[self.pad_id]] * (ub - len(units)),
                                self.pad_id, p)
        slots = np.full(nb, width, np.int32)  # padding rows: out of range, dropped
        slots[:n] = free[:n]
        source = np.zeros(nb, np.int32)
        source[:n] = np.repeat(np.arange(len(units), dtype=np.int32), g)
        pick = np.asarray(rows + [rows[0]] * (nb - n))
        plen = np.asarray([len(self.prompts[r // g]) for r in pick], np.int32)
        rp = jax.tree_util.tree_map(lambda x: x[pick], self.row_params)
        consts = Rows(plen, self.stops[pick], self.budgets[pick], rp, self.keys[pick], np.zeros(nb, np.int32))
        return rows, self.io.put((slots, tokens, mask, consts, source)), ("admit", ub, nb, p)


class _Store:
    """The places of the prompts stored once per group (G > 1) and the row tables of a segment."""

    def __init__(self, places: int, group: int):
        self.free, self.group = list(range(places)), group
        self.place: dict[int, int] = {}  # prompt -> its place
        self.left: dict[int, int] = {}  # prompt -> its rows not yet collected

    def take(self, units: list[int], n: int) -> np.ndarray:
        """[n] places for the prompts `units` (as many free places as units, checked by the caller),
        then out-of-range places (padding prompts: dropped)."""
        for u in units:
            self.place[u], self.left[u] = self.free.pop(0), self.group
        out = np.full(n, len(self.free) + len(self.place), np.int32)
        out[: len(units)] = [self.place[u] for u in units]
        return out

    def collected(self, rows: list[int]) -> None:
        """Frees the place of every prompt whose rows are all collected."""
        for r in rows:
            u = r // self.group
            self.left[u] -= 1
            if not self.left[u]:
                self.free.append(self.place.pop(u))
                del self.left[u]

    def tables(self, owner: np.ndarray, places: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pid [W], gpos [W], members [U, G]) of the slots' rows (`models.prefix_attention.PrefixCache`)."""
        w, g = len(owner), self.group
        pid, gpos = np.full(w, places, np.int32), np.zeros(w, np.int32)
        members = np.full((places, g), w, np.int32)
        for i, r in enumerate(owner):
            if r >= 0:
                pid[i], gpos[i] = self.place[r // g], r % g
                members[pid[i], gpos[i]] = i
        return pid, gpos, members


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
        (slots hold prompt_bucket + max_new cache slots; with G > 1 the prompts are stored apart,
        2W/G places of prompt_bucket slots, and a slot holds max_new); max_new: the output buffer;
      min_prompt_bucket: the smallest admission bucket; on_shape: called with each program shape run.
      mesh: the slots split over its (data, fsdp) axes (W and every width a multiple of their
        size), the caches by `parallel.CACHE_RULES`. A mesh over several processes: every process
        calls with the same (global) rows and runs the same loop, the device programs collective
        (`sampling.multiprocess`).

    Returns:
      {tokens [R, max_new], logprobs, lengths [R], finish [R], counters {segments, admissions,
      compactions, and `STAT_KEYS` summed}}.
    """
    g, n_rows = group, len(prompts) * group
    if width < g:
        raise ValueError(f"{width} slots cannot hold a group of {g} rows")
    io = Transfers(mesh)
    keys = np.asarray(row_keys(io.host_key(key), jnp.asarray(row_seeds, jnp.uint32), n_rows))
    call = _Call(prompts, budgets, stops, row_params, keys, g, pad_id, min_prompt_bucket, prompt_bucket, io)
    note = on_shape or (lambda shape: None)
    from jaxrl_mt.parallel import row_shards

    m = row_shards(mesh)
    if width % m:
        raise ValueError(f"{width} slots do not split over the mesh's {m} row shards")
    widths = tuple(w for w in slot_widths(width) if w % m == 0)
    start = _fit(widths, min(n_rows, width))
    places = min(len(prompts), 2 * -(-width // g))  # stored prompts (G > 1): groups in flight at most
    store = _Store(places, g) if g > 1 else None
    state = empty_slots(cfg, start, max_new if store else prompt_bucket + max_new, max_new, stops.shape[1], mesh,
                        shared=(places, prompt_bucket) if store else None)
    owner = np.full(start, -1)  # row held by each slot
    out = {"tokens": np.zeros((n_rows, max_new), np.int32), "logprobs": np.zeros((n_rows, max_new), np.float32),
           "lengths": np.zeros(n_rows, np.int32), "finish": np.zeros(n_rows, np.int32)}
    counters = dict.fromkeys(("segments", "admissions", "compactions") + STAT_KEYS, 0)
    waiting = sorted(range(len(prompts)), key=lambda u: -len(prompts[u]))  # longest first (stable)
    done = 0
    while done < n_rows:
        free = [i for i in range(len(owner)) if owner[i] < 0]
        take = waiting[: min(len(free) // g, len(store.free) if store else n_rows)]
        if take:
            rows, args, shape = call.admission(take, free, len(owner))
            if store:
                stored = io.put(store.take(take, args[1].shape[0]))
                state = admit_shared(params, cfg, state, args[0], stored, *args[1:], method=method, mesh=mesh)
            else:
                state = admit(params, cfg, state, *args, method=method, mesh=mesh)
            note(shape)
            owner[free[: len(rows)]] = rows
            waiting, counters["admissions"] = waiting[len(take):], counters["admissions"] + 1
        w = len(owner)
        narrower = max([x for x in widths if x < w], default=0)
        min_free = max(w // 8, g, int((owner < 0).sum()) + 1) if waiting else w - narrower
        tables = io.put(store.tables(owner, places)) if store else None
        state, stats = segment(params, cfg, state, io.put(np.int32(min_free)), tables, method=method, steps=steps,
                               mesh=mesh)
        note(("segment", w, int(state.cache.valid.shape[1]), max_new))
        counters["segments"] += 1
        counters.update({k: counters[k] + int(v) for k, v in zip(STAT_KEYS, io.get(stats)[0].tolist())})
        ended = _collect(state, owner, out, io)
        done += len(ended)
        if store:
            store.collected(ended)
        live = int((owner >= 0).sum())
        if not waiting and 0 < live <= narrower:
            state, owner = _narrow(state, owner, _fit(widths, live), mesh, io)
            counters["compactions"] += 1
    return {**out, "counters": counters}


def _collect(state: SlotState, owner: np.ndarray, out: dict[str, np.ndarray], io: Transfers) -> list[int]:
    """Moves the rows that ended into `out` and frees their slots; returns those rows."""
    (live,) = io.get(state.live)
    ended = [i for i in range(len(owner)) if owner[i] >= 0 and not live[i]]
    if ended:
        toks, lps, count, fin = io.get(state.tokens, state.logprobs, state.count, state.finish)
        for i in ended:
            r = owner[i]
            out["tokens"][r], out["logprobs"][r] = toks[i], lps[i]
            out["lengths"][r], out["finish"][r] = count[i], fin[i]
    rows = [int(owner[i]) for i in ended]
    owner[ended] = -1
    return rows


def _narrow(state: SlotState, owner: np.ndarray, width: int, mesh: Any, io: Transfers
            ) -> tuple[SlotState, np.ndarray]:
    """The held slots gathered into a state of `width` slots (the rest: free slots); `io`: the call's transfers."""
    held = [i for i in range(len(owner)) if owner[i] >= 0]
    keep = held + [i for i in range(len(owner)) if owner[i] < 0][: width - len(held)]
    return compact(state, io.put(np.asarray(keep, np.int32)), mesh=mesh), owner[keep]

"""Slot-state programs of a server on the slot engine: grow a state, stop slots at once.

`sampling.turns.run_turns` with a `poll` hook takes work that arrives while it runs: `grow` pads
a `SlotState` with empty slots (the slot axis, like `slots.widen` pads the cache axis), longer
output buffers (a reply with a larger budget than any before) and wider stop-id lists; `halt`
stops the rows of some slots at once (a conversation dropped by the caller: its client left).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_mt.models.decoder import KVCache
from jaxrl_mt.sampling.kernels import FINISH_LENGTH, Rows
from jaxrl_mt.sampling.methods import RowParams
from jaxrl_mt.sampling.slots import SlotState, _laid_out


def _pad(a: jax.Array, axis: int, size: int, value: Any = 0) -> jax.Array:
    """`a` padded with `value` at the end of `axis` to `size` (>= its length)."""
    more = size - a.shape[axis]
    if more <= 0:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, more)
    return jnp.pad(a, widths, constant_values=value)


@functools.partial(jax.jit, static_argnames=("width", "max_new", "stop_width", "mesh"))  # no donation: new sizes
def grow(state: SlotState, *, width: int, max_new: int, stop_width: int, mesh: Any = None) -> SlotState:
    """`state` with `width` slots, output buffers of `max_new` tokens and `stop_width` stop ids (each at
    least the current one): the new slots are free (not live, empty caches), the held ones unchanged.

    Stored prompts (`state.shared`, a GRPO call's) are not supported: a server's state holds none.
    """
    c, r, w = state.cache, state.rows, width
    cache = KVCache(_pad(c.k, 1, w), _pad(c.v, 1, w), _pad(c.valid, 0, w, False), _pad(c.index, 0, w))
    params = RowParams(_pad(r.params.temperature, 0, w, 1.0), _pad(r.params.top_k, 0, w),
                       _pad(r.params.top_p, 0, w, 1.0))
    rows = Rows(_pad(r.next_pos, 0, w), _pad(_pad(r.stop_ids, 0, w, -1), 1, stop_width, -1), _pad(r.budget, 0, w),
                params, _pad(r.keys, 0, w), _pad(r.offsets, 0, w))
    out = SlotState(cache, _pad(state.pos, 0, w), _pad(state.last, 0, w), _pad(state.count, 0, w),
                    _pad(state.live, 0, w, False), _pad(state.finish, 0, w, FINISH_LENGTH),
                    _pad(_pad(state.tokens, 0, w), 1, max_new), _pad(_pad(state.logprobs, 0, w), 1, max_new), rows,
                    state.shared)
    return _laid_out(out, mesh)


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnames=("state",))
def halt(state: SlotState, slots: jax.Array, *, mesh: Any = None) -> SlotState:
    """`state` with the rows of `slots` [n] stopped (not live; W or more: padding, dropped): their
    slots are free for the next admission."""
    live = state.live.at[slots].set(False, mode="drop")
    finish = state.finish.at[slots].set(FINISH_LENGTH, mode="drop")
    return _laid_out(state.replace(live=live, finish=finish), mesh)

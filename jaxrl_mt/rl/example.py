"""The rollout batch of a GRPO step: one struct, one layout, whatever the device layout.

A :class:`TrainExample` holds Bp prompts once ([Bp, P], left-padded) and N = Bp * group
completions ([N, C], right-padded); completion row i belongs to prompt ``i // group`` (its
``prompt_index``, as the sampler's ``row_source``). Each prompt goes through the model once for
its ``group`` completions, forward and backward (``scoring.grouped_logprobs``). A micro-batch
that would split a group is assembled with ``group = 1`` (each row's prompt repeated): the same
struct, the same code (scored as full rows [prompt | completion]).

Optional fields are None when unused (the step's jit sees a different pytree structure, so
none is carried as a dummy): ``ref_logp`` (the KL term's), ``old_logp`` (``rl.mu > 1``) and
``num_items`` (the ``dapo`` normaliser).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.struct
import numpy as np

from jaxrl_mt.batching import pack_rows

__all__ = ["TrainExample", "assemble_example"]


@flax.struct.dataclass
class TrainExample:
    """Prompts once, their completions, and what the loss needs of each completion row.

    Attributes:
      prompt_tokens, prompt_mask: [Bp, P] left-padded prompt ids and their real tokens.
      completion_tokens, completion_mask: [N, C] right-padded completions, N = Bp * group.
      advantages: [N] group-relative advantages.
      ref_logp: [N, C] reference log-probs (KL term) or None.
      old_logp: [N, C] log-probs under the rollout policy (``rl.mu > 1``) or None.
      num_items: [N] the ``dapo`` normaliser of every row, or None.
      seed: [] uint32 seed of the loss's random choices (Clip-Cov), or None; kept by ``slice_rows``.
      group: completions per prompt (static).
    """

    prompt_tokens: Any
    prompt_mask: Any
    completion_tokens: Any
    completion_mask: Any
    advantages: Any
    ref_logp: Any = None
    old_logp: Any = None
    num_items: Any = None
    seed: Any = None
    group: int = flax.struct.field(pytree_node=False, default=1)

    @property
    def rows(self) -> int:
        """N, the number of completion rows."""
        return int(self.completion_mask.shape[0])

    @property
    def prompt_len(self) -> int:
        """P, the prompt bucket."""
        return int(self.prompt_tokens.shape[1])

    @property
    def prompt_index(self) -> np.ndarray:
        """[N] the prompt row of every completion row (``i // group``)."""
        return np.arange(self.rows) // self.group

    def slice_rows(self, start: int, n: int) -> TrainExample:
        """Completion rows [start, start + n) and their prompts; ``start`` and ``n`` hold whole groups.

        Raises:
          ValueError: the slice would split a group.
        """
        if start % self.group or n % self.group:
            raise ValueError(f"rows [{start}, {start + n}) split groups of {self.group}")
        lo, hi = start // self.group, (start + n) // self.group
        cut = lambda x: None if x is None else x[start:start + n]  # noqa: E731
        return dataclasses.replace(
            self, prompt_tokens=self.prompt_tokens[lo:hi], prompt_mask=self.prompt_mask[lo:hi],
            completion_tokens=cut(self.completion_tokens), completion_mask=cut(self.completion_mask),
            advantages=cut(self.advantages), ref_logp=cut(self.ref_logp), old_logp=cut(self.old_logp),
            num_items=cut(self.num_items))

    def arrays(self) -> dict[str, Any]:
        """The fields that are set, by name (the row arrays, for placement on a mesh)."""
        names = ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask", "advantages", "ref_logp",
                 "old_logp", "num_items")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}


def assemble_example(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
                     prompt_len: int, completion_len: int, *, group: int, advantages: np.ndarray | None = None
                     ) -> TrainExample:
    """Packs Bp prompts and their Bp * ``group`` completions (``group`` consecutive rows per prompt).

    ``group = 1`` with a prompt per completion row is the layout for micro-batches that split groups.

    Raises:
      ValueError: the completions are not ``group`` per prompt, or a row exceeds the buckets.
    """
    if not prompts or len(completions) != len(prompts) * group:
        raise ValueError(f"{len(completions)} completions are not {group} per prompt of {len(prompts)}")
    for i, c in enumerate(completions):
        if len(prompts[i // group]) > prompt_len or len(c) > completion_len:
            raise ValueError(f"row {i}: prompt {len(prompts[i // group])} / completion {len(c)} exceed "
                             f"{prompt_len} / {completion_len}")
    ptok, pmask = pack_rows(prompts, pad_id, prompt_len, align="left")
    ctok, cmask = pack_rows(completions, pad_id, completion_len, align="right")
    adv = np.zeros(len(completions), np.float32) if advantages is None else np.asarray(advantages, np.float32)
    return TrainExample(ptok, pmask, ctok, cmask, adv, group=group)

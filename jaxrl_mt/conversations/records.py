"""The records and hooks of a simulated conversation, and the helpers both runners share.

`ConversationRun` / `TurnRecord` (what is run and recorded), the hooks (`UserPolicy`,
`FinalTurn`, the `on_turn` callback) and each conversation's row seed (`row_seed`), used by the
lockstep runner (`runner`) and the slot path (`slotted`); the chat template's continuation text
(`turn_suffix`: whether a template is prefix-preserving).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import zlib
from typing import Any, Callable, Protocol, Sequence

from jaxrl_mt.chat import ChatError, render

log = logging.getLogger(__name__)

SEED_STRIDE = 1000003  # seed offset between turns
_warned: set[str] = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(msg)


@dataclasses.dataclass
class TurnRecord:
    """One exchange of a conversation."""

    index: int  # 0-based turn number
    user: str  # the user message of this turn
    assistant: str  # the model's reply
    tokens: list[int]  # reply token ids (as generated)
    logprobs: list[float]  # their log-probs under the sampling distribution
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int  # length of the rendered prompt of this turn (reuse_cache: cached + new tokens)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # judge verdicts etc.


@dataclasses.dataclass
class ConversationRun:
    """A conversation being (or having been) simulated."""

    conv_id: str  # unique id (task id, scenario kind, run index)
    system: str | None  # system prompt, or None for the template's default
    user_turns: list[str]  # planned user turns (a fixed-order policy reveals them in order)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    turns: list[TurnRecord] = dataclasses.field(default_factory=list)
    done: bool = False  # no further turns (all revealed, or stopped by a callback)
    stop_reason: str = ""  # why it ended

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat so far: user/assistant messages (the system prompt is added at render time)."""
        out: list[dict[str, str]] = []
        for t in self.turns:
            out += [{"role": "user", "content": t.user}, {"role": "assistant", "content": t.assistant}]
        return out


class UserPolicy(Protocol):
    """Produces the next user message of each active conversation (None ends it)."""

    def next_user_turns(self, runs: Sequence[ConversationRun]) -> list[str | None]: ...


class FinalTurn(Protocol):
    """A hook of `run_conversations` that holds back turns and answers them apart, in one batch.

    SeDT holds back each conversation's final turn (`jaxrl_mt.sedt`): the earlier turns run in
    `run_conversations`' shared loop (same KV cache reuse, same seed stream as the plain
    strategy), the held turns are answered by SeDT's own batched calls.
    """

    def holds(self, run: ConversationRun) -> bool:
        """Whether `run`'s next turn (its user message just fetched) is held back."""
        ...

    def answer(self, runs: Sequence[ConversationRun], messages: Sequence[str], seed: int) -> None:
        """Answers the held runs (appending a TurnRecord to each answered one).

        Args:
          runs: the held runs, in the order of `run_conversations`' runs.
          messages: their held user messages.
          seed: the seed of the turn after the last lockstep turn.
        """
        ...


class FixedOrderUser:
    """Reveals each conversation's planned `user_turns` in order, verbatim."""

    def next_user_turns(self, runs: Sequence[ConversationRun]) -> list[str | None]:
        return [r.user_turns[len(r.turns)] if len(r.turns) < len(r.user_turns) else None for r in runs]


TurnCallback = Callable[[Sequence[ConversationRun]], None]


def _next_turns(user: UserPolicy, active: Sequence[ConversationRun], final_turn: FinalTurn | None,
                held: dict[int, str]) -> tuple[list[ConversationRun], list[str]]:
    """The runs to answer this turn and their user messages; ends runs without one, holds others back."""
    live: list[ConversationRun] = []
    texts: list[str] = []
    for r, nxt in zip(active, user.next_user_turns(active)):
        if nxt is None:
            r.done, r.stop_reason = True, r.stop_reason or "no_more_turns"
        elif final_turn is not None and final_turn.holds(r):
            held[id(r)] = nxt
        else:
            live.append(r)
            texts.append(nxt)
    return live, texts


def _answer_held(final_turn: FinalTurn, runs: list[ConversationRun], held: dict[int, str], seed: int, k: int,
                 on_turn: TurnCallback | None, progress: Callable[[int, int], None] | None) -> None:
    """Hands the held runs to the hook; `on_turn` then sees those it answered."""
    if progress:
        progress(k, len(runs))
    before = [len(r.turns) for r in runs]
    final_turn.answer(runs, [held[id(r)] for r in runs], seed)
    answered = [r for r, n in zip(runs, before) if len(r.turns) > n]
    if on_turn and answered:
        on_turn(answered)


def row_seed(run: ConversationRun, turn: int | None = None) -> int:
    """The row seed of `run`'s turn (default: its next one): crc32 of "conv_id\\0turn" (uint32)."""
    t = len(run.turns) if turn is None else turn
    return zlib.crc32(f"{run.conv_id}\0{t}".encode())


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` names a parameter `name` (``**kwargs`` does not count)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def accepts_reuse_cache(fn: Callable[..., Any]) -> bool:
    """Whether a strategy function names a ``reuse_cache`` parameter (``**kwargs`` does not count)."""
    return _accepts(fn, "reuse_cache")


def turn_suffix(tokenizer: Any, history: Sequence[dict[str, str]], user: str, system: str | None) -> str | None:
    """The template text between the last assistant reply of `history` and the next generation.

    The cached context stands for render(history[:-1]) with the generation prompt followed by
    the reply verbatim; when that text is a prefix of render(history + [user: `user`]) with the
    generation prompt, the rest is returned (ChatML: ``<|im_end|>\n<|im_start|>user\n{user}
    <|im_end|>\n<|im_start|>assistant\n``).

    Args:
      tokenizer: a tokenizer with a chat template.
      history: the chat so far, ending with the assistant reply that is already cached.
      user: the next user message.
      system: the system prompt (None: the template's default).

    Returns:
      The suffix, or None when the template renders the cached part differently once the next
      turn follows (it rewrites an earlier prompt or this reply, e.g. Qwen3 dropping a think block).
    """
    if not history or history[-1]["role"] != "assistant":
        raise ChatError("turn_suffix: the history must end with an assistant message")
    cached = render(tokenizer, history[:-1], add_generation_prompt=True, system=system) + history[-1]["content"]
    full = render(tokenizer, list(history) + [{"role": "user", "content": user}], add_generation_prompt=True,
                  system=system)
    return full[len(cached):] if full.startswith(cached) else None



"""The batched multi-turn runner shared by RL history generation, LiC evaluation and SeDT.

All conversations of a batch advance in lockstep: at turn k every still-active conversation gets
its next user message from a user policy, then ONE batched sampler call answers all of them.
Nobody loops over conversations one at a time.

With ``reuse_cache=True`` each conversation keeps its KV cache between turns (a
``jaxrl_mt.sampling.DecodeSession``): a turn prefills only what is new since the last reply, i.e.
the reply's last sampled token (never fed during decoding) and the chat template's text between
that reply and the next generation prompt (see :func:`turn_suffix`). The model then sees exactly
the tokens it generated (no detokenize/retokenize round trip); a stop token that ended a reply is
replaced by the template's end-of-turn text, as a full re-render would do.

The cache is valid only while the template is prefix-preserving for that conversation: the
previous prompt as rendered, followed by the reply verbatim, must be a prefix of the new
prompt's rendering. This is checked per conversation at every turn (with the real reply, not a
stand-in: Qwen3's template drops the think blocks of earlier replies, and in no-think mode the
empty think block of earlier generation prompts, so it rewrites exactly the turns whose reply
or prompt holds one). Where the check fails the conversation's row is emptied and its whole
prompt prefilled from scratch (logged once); a cache that differs from the rendered prompt is
never reused.

Each conversation samples with its own key: its row seed (:func:`row_seed`) is a hash of its
``conv_id`` and turn index, so a conversation's turn draws the same tokens whichever other
conversations share its batch, and a conversation redone on its own (a resumed evaluation)
equals the one of the uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import zlib
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from jaxrl_mt.chat import ChatError, encode_prompt, encode_text, render, with_system
from jaxrl_mt.sampling import DecodeSession, GenerationResult, Sampler, SamplingConfig

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
    the shared lockstep loop (same KV cache reuse, same seed stream as the plain strategy), the
    held turns are answered by SeDT's own batched calls.
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


def run_conversations(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *,
                      seed: int = 0, user: UserPolicy | None = None,
                      on_turn: TurnCallback | None = None, max_turns: int | None = None,
                      progress: Callable[[int, int], None] | None = None, reuse_cache: bool = False,
                      session: DecodeSession | None = None, final_turn: FinalTurn | None = None
                      ) -> list[ConversationRun]:
    """Advances all conversations turn by turn with one batched sampler call per turn.

    Args:
      sampler: the policy's sampler (with a tokenizer), or a wrapper of one with a ``.sampler``
        attribute (``LengthSortedSampler``; its ``max_cells`` then bounds the cached chunks), or
        a sampler of messages (``generate_messages(chats, sampling, seed=) -> (result,
        prompt_lens)``, e.g. ``jaxrl_mt.remote.RemoteSampler`` for a model behind an API).
      runs: the conversations (fresh, or partly run: they continue from their last turn).
      sampling: sampling settings for every assistant turn.
      seed: base seed; conversation r's turn t samples with fold_in(key(seed), row_seed(r, t))
        (`row_seed`), whatever else is in its batch; a `FinalTurn` hook after k lockstep turns gets
        seed + SEED_STRIDE k.
      user: the user policy (default: FixedOrderUser).
      on_turn: called after every turn with the runs that just got a reply; it may set
        `run.done`/`run.stop_reason` (e.g. LiC stops at the first correct answer) and fill
        `turn.info`.
      max_turns: stop after this many turns in total.
      progress: called as progress(turn_index, n_active).
      reuse_cache: keep each conversation's KV cache across turns and prefill only the new
        tokens (see the module doc); `TurnRecord.prompt_tokens` is then the real context length
        (cached + new tokens). Falls back to full re-prefill, with a warning, when the chat
        template does not render a reply verbatim and prefix-consistently, or when the sampler
        is not a plain `Sampler` (a subclass overriding `generate_ids` is honoured that way).
        A conversation whose last reply was changed by `on_turn` is re-prefilled in full.
      session: a DecodeSession with one row per run (row i = runs[i]) to use (implies
        reuse_cache); the caller can inspect it (e.g. `session.tokens`) in `on_turn`.
      final_turn: a hook that holds back turns (`FinalTurn.holds`, asked for every run that got a
        next user message); a held run leaves the lockstep loop (its cached row is freed) and
        after the loop `FinalTurn.answer` gets all held runs at once, with the seed of the next
        turn; `progress` and `on_turn` see that batch like any other turn.

    Returns:
      The same run objects, updated in place.
    """
    user = user or FixedOrderUser()
    cached = _CachedTurns.create(sampler, runs, session) if (reuse_cache or session is not None) else None
    held: dict[int, str] = {}  # id(run) -> its held user message
    k = 0
    while True:
        active = [r for r in runs if not r.done and id(r) not in held]
        if not active or (max_turns is not None and k >= max_turns):
            break
        live, texts = _next_turns(user, active, final_turn, held)
        if cached is not None:
            cached.release([r for r in active if id(r) in held])
        if not live:
            break
        if progress:
            progress(k, len(live))
        _answer(sampler, cached, live, texts, sampling, seed)
        if on_turn:
            on_turn(live)
        if cached is not None:
            cached.release_done()
        k += 1
    if held and final_turn is not None:
        _answer_held(final_turn, [r for r in runs if id(r) in held], held, seed + SEED_STRIDE * k, k, on_turn,
                     progress)
    for r in runs:
        if not r.done and len(r.turns) >= len(r.user_turns):
            r.done, r.stop_reason = True, r.stop_reason or "no_more_turns"
    if cached is not None:
        cached.release_done()
    return list(runs)


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


def _answer(sampler: Sampler, cached: "_CachedTurns | None", live: Sequence[ConversationRun], texts: Sequence[str],
            sampling: SamplingConfig, seed: int) -> None:
    """One batched sampler call for the live runs (cached or fully re-rendered); appends their turns."""
    seeds = [row_seed(r) for r in live]
    got = cached.answer(live, texts, sampling, seed, seeds) if cached is not None else None
    if got is not None:
        res, prompt_lens = got
    elif hasattr(sampler, "generate_messages"):  # a model behind an API (jaxrl_mt.remote): messages in
        chats = [with_system(r.messages + [{"role": "user", "content": u}], r.system) for r, u in zip(live, texts)]
        res, prompt_lens = sampler.generate_messages(chats, sampling, seed=seed)
    else:
        prompts = [encode_prompt(sampler.tokenizer, r.messages + [{"role": "user", "content": u}], system=r.system)
                   for r, u in zip(live, texts)]
        kw = {"row_seeds": seeds} if _accepts(sampler.generate_ids, "row_seeds") else {}
        res = sampler.generate_ids(prompts, sampling, seed=seed, **kw)
        prompt_lens = [len(p) for p in prompts]
    for i, (r, u) in enumerate(zip(live, texts)):
        r.turns.append(TurnRecord(index=len(r.turns), user=u, assistant=res.texts[i],
                                  tokens=list(res.tokens[i]), logprobs=[float(x) for x in res.logprobs[i]],
                                  finish_reason=res.finish_reasons[i], prompt_tokens=prompt_lens[i]))


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


class _CachedTurns:
    """The KV-cache side of `run_conversations`: one DecodeSession row per run."""

    def __init__(self, session: DecodeSession, runs: Sequence[ConversationRun]):
        self.session = session
        self.tokenizer = session.sampler.tokenizer
        self.row = {id(r): i for i, r in enumerate(runs)}
        self.runs = list(runs)
        self.seen: list[tuple[int, str] | None] = [None] * len(runs)  # (turns, last reply) when cached
        self.refilled: list[tuple[str, int]] = []  # (conv_id, turn index) re-prefilled: not prefix-preserving

    @classmethod
    def create(cls, sampler: Any, runs: Sequence[ConversationRun], session: DecodeSession | None
               ) -> "_CachedTurns | None":
        """The cache keeper, or None (with a warning, once) when reuse cannot be used."""
        if not runs:
            return None
        inner = getattr(sampler, "sampler", None)
        base = inner if isinstance(inner, Sampler) else sampler
        if session is None:
            if not isinstance(base, Sampler) or type(base).generate_ids is not Sampler.generate_ids:
                _warn_once("sampler", f"reuse_cache: {type(base).__name__} is not a plain Sampler (its generate_ids "
                                      "would be bypassed); using full re-prefill")
                return None
            if base.tokenizer is None or getattr(base.tokenizer, "chat_template", None) is None:
                return None  # the full path raises the chat error
            probe = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
            if turn_suffix(base.tokenizer, probe, "c", None) is None:
                _warn_once("template", "reuse_cache: the chat template does not render a reply verbatim and "
                                       "prefix-consistently; using full re-prefill")
                return None
            session = DecodeSession(base, len(runs), max_cells=getattr(sampler, "max_cells", None))
        elif session.n_rows != len(runs):
            raise ValueError(f"session has {session.n_rows} rows for {len(runs)} runs")
        keeper = cls(session, runs)
        keeper.release_done()
        return keeper

    def release_done(self) -> None:
        """Frees the caches of finished runs."""
        self.release([r for r in self.runs if r.done])

    def release(self, runs: Sequence[ConversationRun]) -> None:
        """Frees the caches of runs that will not be continued."""
        rows = [self.row[id(r)] for r in runs if self.row[id(r)] not in self.session.released]
        if rows:
            self.session.release(rows)

    def _segment(self, i: int, r: ConversationRun, u: str) -> list[int]:
        """The tokens to feed row i before its next reply."""
        s = self.session
        seen = self.seen[i]
        if s.tokens[i] and r.turns and seen == (len(r.turns), r.turns[-1].assistant):
            tail = turn_suffix(self.tokenizer, r.messages, u, r.system)
            if tail is not None:
                ids = encode_text(self.tokenizer, tail)
                pend = s.pending[i]
                # a stop token that ended the reply is replaced by the template's end-of-turn text
                return ([pend] if pend is not None and s.finish[i] != "stop" else []) + ids
            self.refilled.append((r.conv_id, len(r.turns)))
            _warn_once("suffix", f"reuse_cache: the chat template renders conversation {r.conv_id!r}'s cached turns "
                                 f"differently at turn {len(r.turns)} (not prefix-preserving, e.g. Qwen3 dropping an "
                                 "earlier think block); re-prefilling such conversations from scratch (logged once)")
        if s.tokens[i]:  # edited or inconsistent history: start the row over
            s.reset([i])
        return encode_prompt(self.tokenizer, r.messages + [{"role": "user", "content": u}], system=r.system)

    def answer(self, live: Sequence[ConversationRun], texts: Sequence[str], sampling: SamplingConfig,
               seed: int, seeds: Sequence[int]) -> tuple[GenerationResult, list[int]]:
        """One session step for the live runs; returns their results and context lengths."""
        s = self.session
        segments: list[list[int] | None] = [None] * s.n_rows
        rows = [self.row[id(r)] for r in live]
        for i, r, u in zip(rows, live, texts):
            segments[i] = self._segment(i, r, u)
        prompt_lens = [len(s.tokens[i]) + len(segments[i]) for i in rows]
        row_seeds = np.zeros(s.n_rows, np.uint32)
        row_seeds[rows] = seeds
        res = s.step(segments, sampling, seed=seed, row_seeds=row_seeds)
        for i, r in zip(rows, live):
            self.seen[i] = (len(r.turns) + 1, res.texts[i])
        pick = GenerationResult([res.tokens[i] for i in rows], [res.logprobs[i] for i in rows],
                                res.lengths[rows], [res.finish_reasons[i] for i in rows],
                                [res.texts[i] for i in rows], dict(res.stats))
        return pick, prompt_lens

"""LiC conversation simulation: plan the runs, judge and score each assistant turn, keep transcripts.

The conversations themselves are advanced by ``jaxrl_mt.conversations.run_conversations`` (one
batched sampler call per turn for the whole batch); this module adds what the LiC benchmark
needs around it:

- :func:`plan_runs`: N ``ConversationRun`` per (instruction, scenario), ``conv_id`` =
  ``"{task_id}|{kind}|{run}"``, built with ``jaxrl_mt.data.build_scenario``.
- :class:`TurnScorer`: the ``on_turn`` callback. It classifies each new reply with the judge
  (rule-based or LLM, one batched call per turn), extracts and checks the answer with the
  training verifier (``jaxrl_mt.rewards.verifier``; other domains than math: the task's
  plug-in, see ``jaxrl_mt.eval.task_scoring``), records the verdict in ``turn.info`` and,
  under the ``lic`` protocol, ends a conversation at its first correct answer attempt. Finished
  conversations are handed to a sink (the transcript file) as soon as they finish.
- Scoring protocols (pure functions of the per-turn verdicts, so a report can be recomputed from
  transcripts): ``lic`` scores the last answer attempt (0 when none); ``final_turn`` scores the
  last turn only (RLSTA's MT-Add / MT-Refine evaluation).
- :class:`TranscriptStore`: ``transcripts.jsonl``, one line per finished conversation, appended
  as they finish; on restart the conversations already there are skipped.
- Strategies: how a batch of runs is answered, looked up by the config field ``strategy`` in
  ``jaxrl_mt.strategies.STRATEGIES`` (``"plain"`` is ``run_conversations`` itself, ``"sedt"``
  SeDT's, a built-in loaded on first use).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


from jaxrl_mt import strategies
from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.conversations import ConversationRun, FixedOrderUser, UserPolicy, accepts_reuse_cache
from jaxrl_mt.data.records import LIC_SCENARIOS, DataError, ShardedTask, canonical_kind
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.eval.errors import EvalError
from jaxrl_mt.eval.judging import Judge, checked_judge_turn, judge_turn, make_judge
from jaxrl_mt.eval.task_scoring import MATH, score_task_turns
from jaxrl_mt.eval.transcripts import TranscriptStore
from jaxrl_mt.sampling import DEFAULT_MAX_CHUNK_CELLS, LengthSortedSampler, Sampler, SamplingConfig

__all__ = [
    "LIC_SCENARIOS",
    "PROTOCOLS",
    "EvalError",
    "Judge",
    "LengthSortedSampler",
    "TranscriptStore",
    "TurnScorer",
    "canonical_scenarios",
    "conv_id",
    "first_answer_turn",
    "check_strategy",
    "judge_turn",
    "make_judge",
    "plan_runs",
    "run_score",
    "run_scored",
    "simulate",
    "transcript_record",
]

log = logging.getLogger(__name__)

PROTOCOLS = ("lic", "final_turn")
STOP_CORRECT = "correct_answer"  # stop_reason of a lic conversation ended by a correct answer
STOP_TOO_LONG = "prompt_too_long"  # a first prompt that does not fit the context: recorded without turns, score 0
CONTEXT_MARGIN = 16  # tokens of chat-template overhead assumed per extra user turn


def conv_id(task_id: str, kind: str, run: int) -> str:
    """The id of run ``run`` of instruction ``task_id`` in scenario ``kind``."""
    return f"{task_id}|{kind}|{run}"


def canonical_scenarios(kinds: Iterable[str]) -> tuple[str, ...]:
    """Canonical LiC scenario kinds (``mt_add`` -> ``sharded``), order kept, duplicates dropped.

    Raises:
      EvalError: an unknown kind, or one that is not a LiC scenario (e.g. ``underspecified``).
    """
    out: list[str] = []
    for k in kinds:
        try:
            c = canonical_kind(k)
        except DataError as e:
            raise EvalError(f"config field 'scenarios': {e}") from None
        if c not in LIC_SCENARIOS:
            raise EvalError(f"config field 'scenarios': {k!r} is not a LiC evaluation scenario; "
                            f"valid: {', '.join(LIC_SCENARIOS)}")
        if c not in out:
            out.append(c)
    if not out:
        raise EvalError("config field 'scenarios': no scenario given")
    return tuple(out)


def plan_runs(tasks: Sequence[ShardedTask], kinds: Sequence[str], runs: int, *, seed: int = 0,
              system: str | None | Callable[[ShardedTask], str | None] = None, shuffle: bool = False
              ) -> tuple[list[ConversationRun], list[dict[str, str]]]:
    """The conversations of an evaluation: ``runs`` per (task, scenario kind).

    Scenario-major order (all runs of a kind are adjacent) so that a sampler chunk mostly holds
    prompts of similar length.

    Args:
      tasks: the instructions.
      kinds: canonical scenario kinds.
      runs: N, runs per instruction and scenario.
      seed: the scenario seed (shard order when ``shuffle``, corruption for mt_refine/atr/aiwr).
      system: the system prompt (None: the chat template's default), or a function of the task
        giving it (per-task prompts, ``task_scoring.conversation_system``).
      shuffle: shuffle the order of condition shards (seeded, same for the N runs).

    Returns:
      ``(runs, skipped)``: skipped lists ``{"task_id", "kind", "reason"}`` for tasks that cannot
      make a kind (e.g. nothing to corrupt for mt_refine). ``meta["task"]`` holds the task record
      (for its verifier; transcripts do not copy it).
    """
    if runs < 1:
        raise EvalError(f"config field 'runs': expected >= 1, got {runs}")
    out: list[ConversationRun] = []
    skipped: list[dict[str, str]] = []
    for kind in kinds:
        for task in tasks:
            try:
                sc = build_scenario(task, kind, seed=seed, shuffle=shuffle)
            except DataError as e:
                skipped.append({"task_id": task.task_id, "kind": kind, "reason": str(e)})
                continue
            for r in range(runs):
                meta = {"task_id": task.task_id, "kind": kind, "run": r, "answer": task.answer,
                        "domain": task.domain, "question": task.full_prompt, "n_planned": len(sc.turns),
                        "task": task}
                sys_prompt = system(task) if callable(system) else system
                out.append(ConversationRun(conv_id=conv_id(task.task_id, kind, r), system=sys_prompt,
                                           user_turns=list(sc.turns), meta=meta))
    return out, skipped


# --------------------------------------------------------------------------- scores


def run_score(turns: Sequence[Mapping[str, Any]], protocol: str) -> tuple[float, int | None]:
    """A conversation's score from its per-turn verdicts.

    Args:
      turns: per turn, a mapping with ``answer_attempt`` and ``correct`` (as ``judge_turn``).
      protocol: ``"lic"``: the correctness of the last answer attempt (0 when there is none);
        ``"final_turn"``: the correctness of the last turn.

    Returns:
      ``(score in {0, 1}, 1-based turn that was scored or None)``.
    """
    if protocol == "lic":
        for k in range(len(turns) - 1, -1, -1):
            if turns[k]["answer_attempt"]:
                return float(turns[k]["correct"]), k + 1
        return 0.0, None
    if protocol == "final_turn":
        return (float(turns[-1]["correct"]), len(turns)) if turns else (0.0, None)
    raise EvalError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")


def first_answer_turn(turns: Sequence[Mapping[str, Any]]) -> int | None:
    """1-based turn of the first answer attempt, or None."""
    return next((k + 1 for k, t in enumerate(turns) if t["answer_attempt"]), None)


def transcript_record(run: ConversationRun, protocol: str) -> dict[str, Any]:
    """The JSON line of a finished conversation (every turn, verdicts, score)."""
    turns = []
    for t in run.turns:
        turns.append({"index": t.index, "user": t.user, "assistant": t.assistant,
                      "finish_reason": t.finish_reason, "new_tokens": len(t.tokens),
                      "prompt_tokens": t.prompt_tokens, **t.info})
    score, scored = run_score(turns, protocol)
    m = run.meta
    return {"conv_id": run.conv_id, "task_id": m["task_id"], "kind": m["kind"], "run": m["run"],
            "gold": m["answer"], "domain": m["domain"], "protocol": protocol,
            "n_planned_turns": m["n_planned"], "n_turns": len(turns), "stop_reason": run.stop_reason,
            "score": score, "scored_turn": scored, "first_answer_turn": first_answer_turn(turns),
            "turns": turns}


class TurnScorer:
    """The ``on_turn`` callback: judge, verify, stop (lic) and flush finished conversations."""

    def __init__(self, runs: Sequence[ConversationRun], judge: Judge, *, protocol: str,
                 verifier_mode: str, sink: Callable[[list[dict[str, Any]]], None] | None = None,
                 tasks: Mapping[str, Any] | None = None):
        """Args:
          runs: every run of the batch (those finished without a turn callback, e.g. a user
            policy that ended them, are flushed at the next call or by :meth:`flush`).
          judge: the response-type judge.
          protocol: ``"lic"`` or ``"final_turn"``.
          verifier_mode: ``"strict"`` or ``"lenient"``.
          sink: receives transcript records of finished conversations.
          tasks: task plug-ins by domain for non-math replies (default: ``jaxrl_mt.tasks`` registry;
            see ``jaxrl_mt.eval.task_scoring``).
        """
        if protocol not in PROTOCOLS:
            raise EvalError(f"config field 'protocol': unknown {protocol!r}; valid: {', '.join(PROTOCOLS)}")
        self.runs, self.judge, self.protocol, self.mode = list(runs), judge, protocol, verifier_mode
        self.sink, self.tasks = sink, tasks
        self.flushed: set[str] = set()

    def __call__(self, live: Sequence[ConversationRun]) -> None:
        texts = [r.turns[-1].assistant for r in live]
        verdicts = self.judge.judge(texts, [r.meta["question"] for r in live], [r.meta["domain"] for r in live],
                                    [r.turns[-1].user for r in live])
        other = [i for i, r in enumerate(live) if r.meta["domain"] != MATH]
        infos = dict(zip(other, score_task_turns([texts[i] for i in other], [live[i].meta.get("task") for i in other],
                                                 [verdicts[i][0] for i in other], plugins=self.tasks,
                                                 llm_label=self.judge.backend is not None)))
        for i, (r, text, (label, answer)) in enumerate(zip(live, texts, verdicts)):
            turn = r.turns[-1]
            turn.info.update(infos.get(i) or checked_judge_turn(text, r.meta["answer"], label, self.mode, answer))
            sim = r.meta.get("user_sim")
            if sim and len(sim) >= len(r.turns):
                s = sim[len(r.turns) - 1]
                turn.info.update({"user_unit": s["unit"], "user_check": s["reason"], "user_fallback": s["fallback"]})
                if s["fallback"]:
                    turn.info["user_sim_reply"] = s.get("raw", "")  # the rejected message, for audit
            if self.protocol == "lic" and turn.info["answer_attempt"] and turn.info["correct"] >= 1.0:
                r.done, r.stop_reason = True, STOP_CORRECT
            elif len(r.turns) >= r.meta["n_planned"]:
                r.done, r.stop_reason = True, r.stop_reason or "no_more_turns"
        self.flush()

    def flush(self) -> int:
        """Hands finished, not yet flushed conversations to the sink; returns how many."""
        done = [r for r in self.runs if r.done and (r.turns or r.stop_reason == STOP_TOO_LONG)
                and r.conv_id not in self.flushed]
        if done and self.sink is not None:
            self.sink([transcript_record(r, self.protocol) for r in done])
        self.flushed.update(r.conv_id for r in done)
        return len(done)


class ContextGuard:
    """Wraps a user policy: ends a conversation whose next prompt would not fit the context.

    The next prompt's length is bounded by the last prompt, the last reply, the new user message
    and ``CONTEXT_MARGIN`` template tokens; such a conversation stops with ``"context_full"``. A first
    prompt (rendered exactly) that leaves no room for the reply ends its conversation before any turn
    with ``"prompt_too_long"`` (recorded, score 0); the others go on.
    """

    def __init__(self, user: UserPolicy, tokenizer: Any, max_context: int, max_new_tokens: int):
        self.user, self.tokenizer = user, tokenizer
        self.limit = max_context - max_new_tokens
        self.stopped = 0

    def next_user_turns(self, runs: Sequence[ConversationRun]) -> list[str | None]:
        nexts = self.user.next_user_turns(runs)
        out: list[str | None] = []
        for r, u in zip(runs, nexts):
            if u is not None and not r.turns:
                if len(encode_prompt(self.tokenizer, [{"role": "user", "content": u}], system=r.system)) > self.limit:
                    r.done, r.stop_reason, u = True, STOP_TOO_LONG, None
                    self.stopped += 1
            if u is not None and r.turns:
                last = r.turns[-1]
                need = last.prompt_tokens + len(last.tokens) + len(self.tokenizer.encode(u)) + CONTEXT_MARGIN
                if need > self.limit:
                    r.stop_reason = "context_full"
                    self.stopped += 1
                    u = None
            out.append(u)
        return out


# --------------------------------------------------------------------------- strategies


def check_strategy(name: str) -> strategies.Strategy:
    """The strategy ``name`` of ``strategies.STRATEGIES``, as the config field ``strategy``.

    Raises:
      EvalError: ``config field 'strategy': unknown strategy ...; known: ...`` for an unknown name.
    """
    try:
        return strategies.STRATEGIES.get(name)
    except KeyError as e:
        raise EvalError(f"config field 'strategy': {e.args[0]}") from None


def simulate(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *,
             judge: Judge, protocol: str, verifier_mode: str, user: UserPolicy | None = None,
             seed: int = 0, strategy: str = "plain",
             sink: Callable[[list[dict[str, Any]]], None] | None = None,
             progress: Callable[[int, int], None] | None = None,
             max_chunk_cells: int = DEFAULT_MAX_CHUNK_CELLS, reuse_cache: bool = True,
             tasks: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Simulates every run (`run_conversations`: on the slot engine, conversations proceeding apart,
    or in lockstep) and returns their transcript records.

    Args:
      sampler: the evaluated model's sampler (its ``max_batch`` caps each sampler call).
      runs: fresh conversations from :func:`plan_runs`.
      sampling: sampling settings of the assistant.
      judge, protocol, verifier_mode: see :class:`TurnScorer`.
      user: the user policy (default: fixed order); wrapped in a :class:`ContextGuard`.
      seed: the sampling seed.
      strategy: a registered strategy name.
      sink: receives records as conversations finish (e.g. ``TranscriptStore.append``).
      progress: ``progress(turn_index, n_active)``.
      max_chunk_cells: memory bound of one sampler chunk (see :class:`LengthSortedSampler`, which
        wraps ``sampler``).
      reuse_cache: keep each conversation's KV cache across turns (prefill only the new tokens,
        see ``run_conversations``); passed to the strategy only if it has a ``reuse_cache``
        parameter (the plain one does; strategies without it run as before).
      tasks: task plug-ins by domain for non-math replies (see :class:`TurnScorer`).

    Returns:
      One transcript record per run, in the order of ``runs``.
    """
    def answer(scorer: TurnScorer) -> None:
        guard = ContextGuard(user or FixedOrderUser(), sampler.tokenizer, sampler.cfg.max_position_embeddings,
                             sampling.max_new_tokens)
        fn = check_strategy(strategy)
        kw: dict[str, Any] = {"reuse_cache": reuse_cache} if accepts_reuse_cache(fn) else {}
        fn(LengthSortedSampler(sampler, max_chunk_cells), runs, sampling, seed=seed, user=guard, on_turn=scorer,
           progress=progress, **kw)

    return run_scored(runs, answer, judge=judge, protocol=protocol, verifier_mode=verifier_mode, sink=sink,
                      tasks=tasks)


def run_scored(runs: Sequence[ConversationRun], answer: Callable[[TurnScorer], None], *, judge: Judge,
               protocol: str, verifier_mode: str, sink: Callable[[list[dict[str, Any]]], None] | None = None,
               tasks: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Answers ``runs`` with ``answer(scorer)``, scoring every turn, and returns their records.

    Args:
      runs: the conversations.
      answer: advances the runs, calling ``scorer`` (the :class:`TurnScorer`) after every turn.
      judge, protocol, verifier_mode, tasks: see :class:`TurnScorer`.
      sink: receives records as conversations finish.

    Returns:
      One transcript record per run, in the order of ``runs``.
    """
    records: dict[str, dict[str, Any]] = {}

    def collect(recs: list[dict[str, Any]]) -> None:
        for rec in recs:
            records[rec["conv_id"]] = rec
        if sink is not None:
            sink(recs)

    if not runs:
        return []
    scorer = TurnScorer(runs, judge, protocol=protocol, verifier_mode=verifier_mode, sink=collect, tasks=tasks)
    answer(scorer)
    for r in runs:  # e.g. ended by the user policy after their last on_turn
        r.done = True
    scorer.flush()
    return [records[r.conv_id] for r in runs if r.conv_id in records]

"""`run_conversations`' final-turn hook, and SeDT's earlier turns through the shared lockstep loop."""

from __future__ import annotations

import copy

from jaxrl_mt.conversations import SEED_STRIDE, ConversationRun, TurnRecord, row_seed, run_conversations
from jaxrl_mt.sampling import DecodeSession, SamplingConfig
from jaxrl_mt.sedt import SeDTConfig, sedt_strategy
from tests.test_kv_reuse import chat_sampler, make_runs

SAMPLE6 = SamplingConfig(max_new_tokens=6, temperature=1.0)


class HoldLast:
    """Holds each run's last planned turn; answers all held runs with a fixed reply."""

    def __init__(self):
        self.calls: list[tuple[list[str], list[str], int]] = []

    def holds(self, run: ConversationRun) -> bool:
        return len(run.turns) + 1 == len(run.user_turns)

    def answer(self, runs, messages, seed):
        self.calls.append(([r.conv_id for r in runs], list(messages), seed))
        for r, m in zip(runs, messages):
            r.turns.append(TurnRecord(index=len(r.turns), user=m, assistant="held", tokens=[], logprobs=[],
                                      finish_reason="stop", prompt_tokens=0))


def test_final_turn_hook_holds_the_last_turns_and_answers_them_once(tiny_chat_model_dir):
    sampler = chat_sampler(tiny_chat_model_dir)
    runs = make_runs([3, 1, 2])
    session = DecodeSession(sampler, len(runs))
    hook, seen, progress = HoldLast(), [], []
    run_conversations(sampler, runs, SAMPLE6, seed=5, session=session, final_turn=hook,
                      on_turn=lambda live: seen.append([r.conv_id for r in live]),
                      progress=lambda k, n: progress.append((k, n)))
    # lockstep turns: c0 and c2 at turn 0 (c1's only turn is its last: held), c0 at turn 1
    assert seen == [["c0", "c2"], ["c0"], ["c0", "c1", "c2"]]
    assert progress == [(0, 2), (1, 1), (2, 3)]
    # one call with every held run (in the runs' order), the seed of the turn after the last lockstep turn
    assert hook.calls == [(["c0", "c1", "c2"], [r.user_turns[-1] for r in runs], 5 + 2 * SEED_STRIDE)]
    assert [len(r.turns) for r in runs] == [3, 1, 2] and all(r.done for r in runs)
    assert [r.turns[-1].assistant for r in runs] == ["held"] * 3
    assert session.released == {0, 1, 2}  # held rows leave the cache at once


def test_sedt_earlier_turns_share_the_plain_loop_cache_and_seeds(tiny_chat_model_dir, monkeypatch):
    """SeDT's earlier turns go through the same cached lockstep steps as the plain strategy, with the
    same seeds; greedy, they are the plain strategy's turns. (Sampled turns may differ once a held
    row shrinks a chunk: a draw depends on the batch layout, as when a plain conversation ends.)"""
    sampler = chat_sampler(tiny_chat_model_dir)
    runs = make_runs([4, 3, 4, 1])
    for r in runs:
        r.meta["n_planned"] = len(r.user_turns)
    steps: list[tuple[str, int]] = []
    real_step = DecodeSession.step

    def step(self, segments, sampling, *, seed=0, **kw):
        live = [i for i, g in enumerate(segments) if g is not None]
        steps.append((name, (seed, tuple((i, int(kw["row_seeds"][i])) for i in live))))
        return real_step(self, segments, sampling, seed=seed, **kw)

    monkeypatch.setattr(DecodeSession, "step", step)
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    plain, sedt = copy.deepcopy(runs), copy.deepcopy(runs)
    name = "plain"
    run_conversations(sampler, plain, greedy, seed=11, reuse_cache=True)
    name = "sedt"
    sedt_strategy(sampler, sedt, greedy, seed=11, reuse_cache=True, config=SeDTConfig(self_correct=False))
    seeds = {n: [sd for m, sd in steps if m == n] for n in ("plain", "sedt")}
    # one base seed; each live row's seed is its conversation's (conv_id, turn) seed
    assert [sd for sd, _ in seeds["plain"]] == [11] * 4
    assert all(rs == row_seed(runs[i], k) for k, (_, rows) in enumerate(seeds["plain"]) for i, rs in rows)
    # turns 0-2 in the cached loop with the plain loop's seeds; the final turns are SeDT's
    assert len(seeds["sedt"]) == 3
    assert all(a[0] == b[0] and set(a[1]) <= set(b[1]) for a, b in zip(seeds["sedt"], seeds["plain"]))
    for p, s in zip(plain, sedt):
        final = len(s.user_turns) >= 2  # a single-turn conversation is answered plainly
        n_same = len(s.turns) - 1 if final else len(s.turns)
        assert len(p.turns) == len(s.turns)
        assert [t.tokens for t in s.turns[:n_same]] == [t.tokens for t in p.turns[:n_same]]
        assert [t.prompt_tokens for t in s.turns[:n_same]] == [t.prompt_tokens for t in p.turns[:n_same]]
        assert ("sedt" in s.turns[-1].info) == final

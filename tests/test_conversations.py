"""`run_conversations`' final-turn hook (lockstep and slot paths), and SeDT's earlier turns through the shared loop."""

from __future__ import annotations

import copy

from jaxrl_mt.conversations import SEED_STRIDE, ConversationRun, TurnRecord, row_seed, run_conversations
from jaxrl_mt.sampling import Sampler, SamplingConfig
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
    got = {}
    for reuse in (False, True):  # the lockstep loop (no cache), the slot path (caches kept)
        runs = make_runs([3, 1, 2])
        hook, seen, progress = HoldLast(), [], []
        run_conversations(sampler, runs, SAMPLE6, seed=5, final_turn=hook, reuse_cache=reuse,
                          on_turn=lambda live, out=seen: out.append([r.conv_id for r in live]),
                          progress=lambda k, n, out=progress: out.append((k, n)))
        # one call with every held run (in the runs' order), the seed of the turn after the last earlier turn
        assert hook.calls == [(["c0", "c1", "c2"], [r.user_turns[-1] for r in runs], 5 + 2 * SEED_STRIDE)]
        assert [len(r.turns) for r in runs] == [3, 1, 2] and all(r.done for r in runs)
        assert [r.turns[-1].assistant for r in runs] == ["held"] * 3
        assert seen[-1] == ["c0", "c1", "c2"] and progress[-1] == (2, 3)  # the held batch, after the others
        got[reuse] = ([[t.tokens for t in r.turns] for r in runs], seen, progress)
    # lockstep turns: c0 and c2 at turn 0 (c1's only turn is its last: held), c0 at turn 1
    assert got[False][1:] == ([["c0", "c2"], ["c0"], ["c0", "c1", "c2"]], [(0, 2), (1, 1), (2, 3)])
    assert got[True][0] == got[False][0]  # the same draws with and without the kept caches


def test_sedt_earlier_turns_share_the_plain_loop_cache_and_seeds(tiny_chat_model_dir, monkeypatch):
    """SeDT's earlier turns go through the same slot-engine call as the plain strategy (each
    conversation's cache kept in its slot), with the same seeds; greedy, they are the plain
    strategy's turns."""
    sampler = chat_sampler(tiny_chat_model_dir)
    runs = make_runs([4, 3, 4, 1])
    for r in runs:
        r.meta["n_planned"] = len(r.user_turns)
    feeds: list[tuple[str, int, int, int, bool]] = []  # (strategy, base seed, conversation, row seed, fresh)
    real = Sampler.run_turns

    def run_turns(self, first, sampling, advance, *, seed=0, **kw):
        def spy(replies):
            out = advance(replies)
            feeds.extend((name, seed, f.conv, f.seed, f.fresh) for f in out)
            return out

        feeds.extend((name, seed, f.conv, f.seed, f.fresh) for f in first)
        return real(self, first, sampling, spy, seed=seed, **kw)

    monkeypatch.setattr(Sampler, "run_turns", run_turns)
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    plain, sedt = copy.deepcopy(runs), copy.deepcopy(runs)
    name = "plain"
    run_conversations(sampler, plain, greedy, seed=11, reuse_cache=True)
    name = "sedt"
    sedt_strategy(sampler, sedt, greedy, seed=11, reuse_cache=True, config=SeDTConfig(self_correct=False))
    got = {n: [(c, rs, fresh) for m, sd, c, rs, fresh in feeds if m == n and sd == 11] for n in ("plain", "sedt")}
    assert len(got["plain"]) + len(got["sedt"]) == len(feeds)  # one base seed for both
    # each conversation's turn t samples with its (conv_id, t) seed; its first turn is prefilled whole
    # (a later one only where its reply re-tokenises otherwise: tests/test_turns.py)
    for i, r in enumerate(runs):
        mine = [(rs, fresh) for c, rs, fresh in got["plain"] if c == i]
        assert [rs for rs, _ in mine] == [row_seed(r, t) for t in range(len(r.user_turns))] and mine[0][1]
    assert sum(not fresh for _, _, fresh in got["plain"]) >= 3  # kept caches were continued
    # SeDT's cached turns are the plain loop's, its final turns held (answered by its own calls)
    assert sorted(got["sedt"]) == sorted(f for f in got["plain"]
                                         if f[1] != row_seed(runs[f[0]], len(runs[f[0]].user_turns) - 1)
                                         or len(runs[f[0]].user_turns) < 2)
    for p, s in zip(plain, sedt):
        final = len(s.user_turns) >= 2  # a single-turn conversation is answered plainly
        n_same = len(s.turns) - 1 if final else len(s.turns)
        assert len(p.turns) == len(s.turns)
        assert [t.tokens for t in s.turns[:n_same]] == [t.tokens for t in p.turns[:n_same]]
        assert [t.prompt_tokens for t in s.turns[:n_same]] == [t.prompt_tokens for t in p.turns[:n_same]]
        assert ("sedt" in s.turns[-1].info) == final

"""SeDT: the relevance math by hand, the guard, one scoring path, batching, the evaluator strategy.

Model-backed tests use the session's tiny random Llama (2 layers, width 32) with the embedded
model's tokenizer and chat template (``tiny_chat_model_dir`` in conftest).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from jaxrl_mt import scoring
from jaxrl_mt.conversations import ConversationRun
from jaxrl_mt.eval.sedt_eval import correction_outcomes, parse_overrides
from jaxrl_mt.eval.simulator import judge_turn, run_score
from jaxrl_mt.rewards.judge import RESPONSE_TYPES, classify_rule_based
from jaxrl_mt.rewards.verifier import find_numbers, format_number, verify
from jaxrl_mt.sampling import SamplingConfig
from tests.sampler_spy import RecordingSampler, recording_sampler
from jaxrl_mt.sedt import (
    CONFIRMED,
    UNCERTAIN,
    Annotation,
    SeDTConfig,
    annotate,
    annotate_batch,
    content_words,
    correction_prompt,
    coverage,
    format_prompt,
    guard_replace,
    jaccard,
    labels_from_relevance,
    make_embedder,
    positional_weights,
    relevance,
    respond,
    returns_to_go,
    sedt_final_turn,
    sedt_strategy,
    should_trigger,
)

C, U = CONFIRMED, UNCERTAIN
MATH_ANCHOR = "Compute the final numeric answer to the word problem"


# --------------------------------------------------------------------------- pure math


def test_positional_curve_by_hand_symmetric_and_peaked():
    np.testing.assert_allclose(positional_weights(1), [1.0])
    np.testing.assert_allclose(positional_weights(4), [0.4, 0.8, 0.8, 0.4])  # c = 1.5: 1 - |t - c| / 2.5
    np.testing.assert_allclose(positional_weights(5), [1 / 3, 2 / 3, 1, 2 / 3, 1 / 3])
    for n in range(1, 13):
        p = positional_weights(n)
        np.testing.assert_allclose(p, p[::-1])  # symmetric
        mid = (n - 1) // 2
        assert p.max() == pytest.approx(p[mid]) and np.all(p > 0) and np.all(p <= 1)
        assert np.all(np.diff(p[: mid + 1]) > 0)  # rises strictly to the middle (then falls by symmetry)
    with pytest.raises(ValueError, match="at least one turn"):
        positional_weights(0)


def test_content_words_and_jaccard_by_hand():
    anchor = content_words(MATH_ANCHOR)
    assert anchor == {"compute", "final", "numeric", "answer", "word", "problem"}
    turn = content_words("What is the final answer to this problem?")
    assert turn == {"final", "answer", "problem"}
    assert jaccard(turn, anchor) == 0.5  # 3 shared / 6 in the union
    shard = content_words("Natalia sold clips to 48 of her friends in April.")
    assert shard == {"natalia", "sold", "clips", "48", "friends", "april"}
    assert jaccard(shard, anchor) == 0.0
    assert content_words("She paid $1,234.50 for 3 apples") == {"paid", "1234.50", "3", "apples"}
    assert jaccard(content_words("red apples"), content_words("green apples and pears")) == 1 / 4
    assert jaccard(frozenset(), frozenset()) == 0.0


def test_relevance_rtg_and_labels_by_hand():
    cfg = SeDTConfig()
    sem, lex, pos = np.array([0.9, 0.5, 0.2]), np.array([0.5, 0.0, 0.0]), positional_weights(3)  # pos .5 1 .5
    rel = relevance(sem, lex, pos, cfg)
    # 0.6*0.9 + 0.2*0.5 + 0.2*0.5 = 0.74; 0.6*0.5 + 0.2*1 = 0.5; 0.6*0.2 + 0.2*0.5 = 0.22 -> floor 0.5
    np.testing.assert_allclose(rel, [0.74, 0.5, 0.5])
    np.testing.assert_allclose(returns_to_go(rel), [1.74, 1.0, 0.5])
    assert labels_from_relevance(rel) == (C, U, U)  # mean 0.58
    rel0 = relevance(sem, lex, pos, SeDTConfig(last_shard_floor=0.0))
    np.testing.assert_allclose(rel0, [0.74, 0.5, 0.22])  # no floor: the raw value
    assert labels_from_relevance([0.1, 0.9]) == (U, C)
    assert labels_from_relevance([0.4, 0.4, 0.4]) == (U, U, U)  # nothing is strictly above the mean
    assert labels_from_relevance([0.2, 0.5, 0.5, 0.6]) == (U, C, C, C)  # mean 0.45


def test_rtg_non_increasing_and_last_shard_guarantee_on_random_inputs():
    rng = np.random.default_rng(0)
    for n in range(1, 11):
        for _ in range(50):
            cfg = SeDTConfig(last_shard_floor=float(rng.uniform()))
            shards = [f"turn {i}" for i in range(n)]
            ann = annotate(shards, rng.uniform(size=n), MATH_ANCHOR, cfg)
            rtg = np.array(ann.rtg)
            assert np.all(np.diff(rtg) <= 1e-12)  # R̂ non-increasing
            assert rtg[0] == pytest.approx(sum(ann.rel)) and rtg[-1] == pytest.approx(ann.rel[-1])
            assert ann.rel[-1] >= cfg.last_shard_floor  # the last-shard guarantee
            assert all(0 <= r <= 1 for r in ann.rel)
            mean = np.mean(ann.rel)
            assert ann.labels == tuple(C if r > mean else U for r in ann.rel)


def test_sem_maps_cosine_to_unit_interval():
    from jaxrl_mt.sedt import sem_from_cosine

    np.testing.assert_allclose(sem_from_cosine([-1.0, 0.0, 0.5, 1.0]), [0.0, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(sem_from_cosine([-0.3, 0.4], "clip"), [0.0, 0.4])


def _ann(rel, labels, shards=None) -> Annotation:
    n = len(rel)
    shards = tuple(shards or [f"s{i}" for i in range(n)])
    return Annotation(shards, MATH_ANCHOR, (0.5,) * n, (0.0,) * n, tuple(positional_weights(n)), tuple(rel),
                      tuple(returns_to_go(np.array(rel))), tuple(labels))


def test_trigger_thresholds():
    cfg = SeDTConfig()  # trigger when rel[-1]/max < 0.8 or UNCERTAIN fraction > 0.5
    shards = ["Tom has 3 apples.", "He buys 4 more.", "How many now?"]
    assert not should_trigger(_ann([0.6, 0.7, 0.6], [U, C, C], shards), cfg)  # 0.857, 1/3 uncertain
    assert should_trigger(_ann([0.6, 0.7, 0.5], [C, C, U], shards), cfg)  # 0.5/0.7 = 0.714 < 0.8
    assert should_trigger(_ann([0.6, 0.7, 0.6], [U, C, U], shards), cfg)  # 2/3 uncertain > 0.5
    assert not should_trigger(_ann([0.6, 0.7, 0.6], [U, C, U], shards), SeDTConfig(self_correct=False))
    assert not should_trigger(_ann([0.6, 0.7, 0.5], [U, U, U], shards), cfg)  # no CONFIRMED words: nothing to cover


def test_coverage_guard_replaces_only_when_confirmed_coverage_strictly_rises():
    words = content_words("Natalia sold clips to 48 of her friends in April.")  # 6 words
    orig = "Natalia sold 48 clips."  # natalia, sold, 48, clips: 4/6
    cov = dict(guard="coverage")
    assert coverage(orig, words) == pytest.approx(4 / 6)
    assert not guard_replace(orig, "The answer is 72.", words, **cov)  # 0/6
    assert not guard_replace(orig, "Clips: Natalia sold 48, answer 72.", words, **cov)  # equal 4/6: keep
    assert guard_replace(orig, "Natalia sold 48 clips to friends in April, so 72.", words, **cov)  # 6/6
    assert not guard_replace(orig, "Natalia sold 48 clips to friends.", frozenset(), **cov)  # nothing confirmed
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(12)]
    for _ in range(3000):
        words = frozenset(rng.sample(vocab, rng.randint(0, 6)))
        a = " ".join(rng.sample(vocab, rng.randint(0, 8)))
        b = " ".join(rng.sample(vocab, rng.randint(0, 8)))
        assert guard_replace(a, b, words, **cov) == (len(content_words(b) & words) > len(content_words(a) & words))


def test_no_answer_guard_by_hand():
    words = content_words("Natalia sold clips to 48 of her friends in April.")  # 6 words
    full = "Natalia sold 48 clips to friends in April, so 72."  # 6/6, holds numbers
    assert guard_replace("Natalia sold 48 clips.", full, words, guard="coverage")
    assert not guard_replace("Natalia sold 48 clips.", full, words)  # the original holds a number: kept
    assert not guard_replace("Natalia sold 48 clips.", full, words, guard="no_answer")  # (the default)
    assert guard_replace("Natalia sold clips.", full, words)  # no number, 2/6 -> 6/6: replaced
    assert guard_replace("", full, words) and guard_replace("   ", full, words)
    assert guard_replace("The answer is five.", "Natalia: the answer is 5.", words)  # "five" is not a number
    assert not guard_replace("Natalia sold clips.", "Natalia sold clips to friends in April.", words)  # no number
    assert not guard_replace("Natalia sold clips.", "The answer is 72.", words)  # no coverage rise (2/6 -> 0/6)
    assert not guard_replace("Natalia sold clips.", full, frozenset())  # nothing confirmed
    for orig in ("\\boxed{72}", "#### 72", "-3 clips", "2.5", "1,234", ".5", "$5", "50%", "3/4", "\\frac{1}{2}"):
        assert not guard_replace(orig, full, words)  # every number form the verifier reads counts
    with pytest.raises(ValueError, match="unknown guard 'strict'"):
        guard_replace("a", "b", words, guard="strict")


def test_zero_hurt_without_a_coverage_increase():
    """A right original is never swapped for a wrong correction that covers no more confirmed words."""
    ann = _ann([0.7, 0.8, 0.5], [U, C, U], ["How many clips in all?", "Natalia sold 48 clips in April.",
                                            "She sold half as many in May."])
    words = ann.confirmed_words
    right = "Natalia sold 48 clips in April and 24 in May. The answer is 72."
    wrong = "The answer is 50."
    assert coverage(wrong, words) <= coverage(right, words) and not guard_replace(right, wrong, words)
    infos = [{"original": right, "correction": wrong, "replaced": guard_replace(right, wrong, words)}]
    assert correction_outcomes(infos, ["72"]) == {"replaced": 0, "helped": 0, "hurt": 0, "neutral": 0}
    # the evaluation counts a hurt case when one does happen (a replacement that raised coverage)
    hurt = [{"original": "The answer is 72.", "correction": "Natalia sold 48 clips in April. The answer is 48.",
             "replaced": True}]
    helped = [{"original": "The answer is 5.", "correction": "48 in April, 24 in May: the answer is 72.",
               "replaced": True}]
    assert correction_outcomes(hurt + helped, ["72", "72"]) == {"replaced": 2, "helped": 1, "hurt": 1, "neutral": 0}

# ----------------------------------------------------- the default guard cannot hurt (a proof by test)

MODES, PROTOCOLS = ("strict", "lenient"), ("lic", "final_turn")
_WORDS = ["natalia", "sold", "clips", "april", "may", "half", "friends", "apples", "total", "answer", "is", "the",
          "five", "twelve", "seventy-two", "minus", "point", "x", "so", "she"]

# Hand-written originals and candidates: number-less texts (empty, spelled-out numbers, empty markers)
# and every number form the verifier reads (boxed, ####, answer phrase, negative, decimal, comma, ...).
NO_NUMBER = ["", "   ", "The answer is five.", "She sold twelve clips, so the total is seventy-two.",
             "\\boxed{five}", "#### ?", "The answer is", "Let me think about the clips Natalia sold.",
             "I need more information: how many clips in May?", "x minus y", "half of April's clips",
             "The answer is -.", "$", "%", "\\frac{a}{b}"]
WITH_NUMBER = ["\\boxed{72}", "#### 72", "The answer is 72.", "-3", "The answer is -3.", "2.5 apples", "1,234",
               "She sold 48 clips in April and 24 in May, so the answer is 72.", "$5", "50%", "3/4",
               "\\frac{1}{2}", ".5", "The answer is five, or 5.", "Natalia sold 48 clips. #### 48",
               "72 or 48: \\boxed{48}", "The answer is 1,234.5", "\\boxed{-2.5}"]
GOLDS = ["72", "5", "-3", "2.5", "1234", "0", "0.5", "48", "0.75", "1234.5", "-2.5", "She sold 72. #### 72"]


def _number_token(rng: random.Random) -> str:
    v = rng.choice([0, 1, 2, 3, 5, 12, 24, 48, 72, 1234])
    forms = [str(v), f"{v:,}", f"-{v}", f"{v}.5", f"${v}", f"{v}%", f"\\boxed{{{v}}}", f"#### {v}",
             f"The answer is {v}.", f"{v}/4", f"\\frac{{{v}}}{{2}}", ".5", f"-{v}.25"]
    return rng.choice(forms)


def _random_text(rng: random.Random, numbers: bool) -> str:
    """A short text mixing words and (when `numbers`) number tokens in the verifier's forms."""
    toks = [_number_token(rng) if numbers and rng.random() < 0.35 else rng.choice(_WORDS)
            for _ in range(rng.randint(0, 9))]
    return " ".join(toks)


def _triples(n: int, seed: int = 0) -> list[tuple[str, str, str, frozenset[str]]]:
    """Hand-written (original, candidate, gold, words) cases, then `n` seeded random ones."""
    out = []
    texts = NO_NUMBER + WITH_NUMBER
    for o in texts:
        for c in texts:
            for g in GOLDS:
                out.append((o, c, g, content_words(c)))  # words favour the candidate
                out.append((o, c, g, content_words(c) | content_words(o)))
    rng = random.Random(seed)
    for _ in range(n):
        o = _random_text(rng, numbers=rng.random() < 0.5)
        c = _random_text(rng, numbers=rng.random() < 0.8)
        pool = find_numbers(o) + find_numbers(c)
        r = rng.random()
        if pool and r < 0.6:  # often a gold that one of the texts holds (so right and wrong both occur)
            g = format_number(rng.choice(pool))
        else:
            g = rng.choice(GOLDS)
        vocab = sorted(content_words(c) | content_words(o) | {rng.choice(_WORDS)})
        words = frozenset(rng.sample(vocab, rng.randint(0, len(vocab))))
        out.append((o, c, g, words))
    return out


def _histories(gold: str, mode: str) -> list[list[dict]]:
    """Earlier turns a conversation can have when it reaches its final turn: wrong attempts and non-attempts
    (under lic, a correct attempt would have ended it; a non-attempt may even hold the right number)."""
    wrong = [judge_turn(t, gold, "answer_attempt", mode) for t in ("The answer is 987654.", "#### 31337", "")]
    assert all(w["correct"] == 0.0 for w in wrong)
    asks = [judge_turn(f"Is it {gold}? How many clips in May?", gold, "clarification", mode),
            judge_turn("Let me think.", gold, "discussion", mode), judge_turn("", gold, "missing", mode)]
    return [[], wrong[:1], asks[:1], [wrong[0], asks[0]], [asks[1], wrong[1], asks[2]], wrong, asks]


def _final_labels(text: str) -> list[str]:
    """Labels a judge may give the final turn: the rule-based judge's, and every type (an LLM judge)."""
    return list(dict.fromkeys([classify_rule_based(text, "math"), *RESPONSE_TYPES]))


def test_no_answer_guard_never_hurts_verifier_or_run_score():
    """Whenever the default guard replaces, the verifier score (strict and lenient) and the LiC / final-turn run
    score of the conversation cannot drop, for every gold answer, judge label and earlier (wrong) turns."""
    triples = _triples(4000)
    replaced = helped = 0
    for o, c, g, words in triples:
        if not guard_replace(o, c, words, guard="no_answer"):
            continue
        replaced += 1
        assert find_numbers(o) == [] and find_numbers(c) != []
        for mode in MODES:
            before, after = verify(o, g, mode), verify(c, g, mode)
            assert before == 0.0, (o, g, mode)  # the mechanism: a number-less text is wrong for every gold
            assert after >= before, (o, c, g, mode)
            helped += after > before
            finals_o = [judge_turn(o, g, lab, mode) for lab in _final_labels(o)]
            finals_c = [judge_turn(c, g, lab, mode) for lab in _final_labels(c)]
            for hist in _histories(g, mode):
                for proto in PROTOCOLS:
                    worst_after = min(run_score(hist + [t], proto)[0] for t in finals_c)
                    best_before = max(run_score(hist + [t], proto)[0] for t in finals_o)
                    assert worst_after >= best_before, (o, c, g, mode, proto, hist)
    # not vacuous: many replacements happen, and some of them fix a wrong answer
    assert replaced >= 500 and helped >= 50, (replaced, helped)
    outcomes = correction_outcomes([{"original": o, "correction": c, "replaced": guard_replace(o, c, w)}
                                    for o, c, g, w in triples], [g for _, _, g, _ in triples])
    assert outcomes["replaced"] == replaced and outcomes["hurt"] == 0 and outcomes["helped"] > 0


def test_coverage_guard_can_hurt():
    """The ablation guard CAN replace a right answer with a wrong one (so the test above is not vacuous)."""
    words = content_words("Natalia sold 48 clips in April.")
    right, wrong = "The answer is 72.", "Natalia sold 48 clips in April. The answer is 48."
    assert guard_replace(right, wrong, words, guard="coverage") and not guard_replace(right, wrong, words)
    for mode in MODES:
        assert verify(right, "72", mode) == 1.0 and verify(wrong, "72", mode) == 0.0
        for proto in PROTOCOLS:
            hist = [judge_turn("Is it 48?", "72", "clarification", mode)]
            before = run_score(hist + [judge_turn(right, "72", "answer_attempt", mode)], proto)[0]
            after = run_score(hist + [judge_turn(wrong, "72", "answer_attempt", mode)], proto)[0]
            assert (before, after) == (1.0, 0.0)
    # and the random generator finds such cases too: the coverage guard hurts where the default does not
    triples = _triples(4000)
    hurt = sum(guard_replace(o, c, w, guard="coverage") and verify(c, g) < verify(o, g) for o, c, g, w in triples)
    assert hurt >= 50, hurt
    assert not any(guard_replace(o, c, w) and verify(c, g) < verify(o, g) for o, c, g, w in triples)



def test_prompt_format_exact():
    ann = _ann([0.74, 0.5, 0.5], [C, U, U], ["How many?", "Tom has 3 \"red\" apples.", "He buys 4."])
    assert format_prompt(ann, 'End with "The answer is <number>."') == (
        "Here is everything I told you, one message per line as (return-to-go, label, message).\n"
        "Return-to-go is how relevant that message and all later ones are to the task (higher means more); "
        "CONFIRMED messages are key facts, UNCERTAIN ones may matter less.\n"
        '(1.74, CONFIRMED, "How many?")\n'
        '(1.00, UNCERTAIN, "Tom has 3 \\"red\\" apples.")\n'
        '(0.50, UNCERTAIN, "He buys 4.")\n'
        "Task: Compute the final numeric answer to the word problem. Use every CONFIRMED message. "
        'End with "The answer is <number>."')
    cp = correction_prompt(ann, "It is 7.")
    assert "Key facts (CONFIRMED):\n- How many?\nOther messages (UNCERTAIN):\n- Tom has" in cp
    assert "Proposed answer:\nIt is 7." in cp


def test_config_and_input_errors():
    with pytest.raises(ValueError, match="'w_sem', 'w_lex', 'w_pos'"):
        SeDTConfig(w_sem=0.7)
    with pytest.raises(ValueError, match="field 'sem_map'"):
        SeDTConfig(sem_map="raw")
    with pytest.raises(ValueError, match="field 'last_shard_floor'"):
        SeDTConfig(last_shard_floor=1.5)
    with pytest.raises(ValueError, match="field 'encoder'"):
        SeDTConfig(encoder="mpnet")
    with pytest.raises(ValueError, match="SeDTConfig field 'guard': expected one of 'no_answer', 'coverage', "
                                         "got 'strict'"):
        SeDTConfig(guard="strict")
    assert SeDTConfig().guard == "no_answer"
    assert parse_overrides(["guard=coverage"]) == SeDTConfig(guard="coverage")  # the ablation
    with pytest.raises(ValueError, match="field 'guard'"):
        parse_overrides(["guard=none"])
    assert SeDTConfig().anchor("code") == "Write a complete Python function"
    assert parse_overrides(["trigger_last_rel=0.7", "keep_history=true"]) == SeDTConfig(trigger_last_rel=0.7,
                                                                                          keep_history=True)
    with pytest.raises(ValueError, match="--set 'trigger=1'"):
        parse_overrides(["trigger=1"])
    with pytest.raises(ValueError, match="conversation 0, message 1: expected a 'assistant' message"):
        respond(None, [[{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                        {"role": "user", "content": "c"}]])
    with pytest.raises(ValueError, match="conversation 1, message 1: the last message must be the user's"):
        respond(None, [[{"role": "user", "content": "a"}],
                       [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]])


def test_sentence_transformers_encoder_missing_is_a_clear_error():
    try:
        import sentence_transformers  # noqa: F401
        pytest.skip("sentence-transformers is installed")
    except ImportError:
        pass
    with pytest.raises(ValueError, match="needs the sentence-transformers package"):
        make_embedder(SeDTConfig(encoder="st:/nonexistent"))


# --------------------------------------------------------------------------- with a (tiny) model


def _sampler(m) -> RecordingSampler:
    # chunks of 4 rows and one prompt bucket: most calls share one compiled program
    return recording_sampler(m, max_batch=4, min_prompt_bucket=512)


@pytest.fixture
def score_spy(monkeypatch):
    """Records every Scorer.score call (its pool) and every score_batch call (batch rows)."""
    calls: dict[str, list] = {"score": [], "score_batch": []}
    real_score, real_batch = scoring.Scorer.score, scoring.score_batch

    def score(self, contexts, completions, *, pool="completion"):
        calls["score"].append((len(contexts), pool))
        return real_score(self, contexts, completions, pool=pool)

    def score_batch(*a, **kw):
        calls["score_batch"].append(a[2].shape[0])
        return real_batch(*a, **kw)

    monkeypatch.setattr(scoring.Scorer, "score", score)
    monkeypatch.setattr(scoring, "score_batch", score_batch)
    return calls


def test_sem_goes_through_the_scorer_the_anchor_reward_uses(tiny_model, score_spy):
    from jaxrl_mt.rewards.anchor import anchor_reward

    s = _sampler(tiny_model)
    cfg = SeDTConfig()
    convs = [["How many clips did Natalia sell?", "She sold 48 in April.", "Half as many in May."],
             ["How many apples?", "Tom has 3 apples."]]
    anns = annotate_batch(make_embedder(cfg, s), convs, ["math", "math"], cfg)
    assert score_spy["score"] == [(6, "completion")]  # ONE call: 5 distinct turns + 1 anchor
    assert len(score_spy["score_batch"]) >= 1  # ... through the jitted scorer
    # parity: the same numbers from embed_texts + cosine directly
    ref = scoring.Scorer(tiny_model.params, tiny_model.cfg, pad_id=tiny_model.pad_id)
    e = scoring.embed_texts(ref, tiny_model.tokenizer, convs[0] + [MATH_ANCHOR])
    want = (scoring.cosine(e[:3], e[3]) + 1) / 2
    np.testing.assert_allclose(anns[0].sem, want, rtol=1e-5, atol=1e-6)
    # the RLSTA anchor reward goes through the very same function
    n = len(score_spy["score"])
    anchor_reward(ref, tiny_model.tokenizer, ["What is 2+2?"], [tiny_model.tokenizer.encode("4")])
    assert len(score_spy["score"]) == n + 1


def _runs(n_turns=(3, 2, 4)):
    runs, finals = [], []
    facts = ["Tom has 3 apples.", "He buys 4 more apples.", "He eats 2 apples.", "He gives 1 away."]
    for i, n in enumerate(n_turns):
        turns = ["How many apples does Tom have now?", *facts[: n - 1]]
        r = ConversationRun(conv_id=f"c{i}", system="Solve it.", user_turns=turns,
                            meta={"domain": "math", "n_planned": n})
        runs.append(r)
        finals.append(turns[-1])
    return runs, finals


def test_final_turn_is_batched_and_guarded(tiny_model, score_spy):
    from jaxrl_mt.conversations import run_conversations
    from jaxrl_mt.sedt import GivenUser

    s = _sampler(tiny_model)
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0)
    runs, finals = _runs()
    for k in range(3):  # history: every turn but the last, with the shared runner
        live = [r for r in runs if len(r.turns) < len(r.user_turns) - 1]
        if live:
            nexts = [r.user_turns[len(r.turns)] for r in live]
            run_conversations(s, live, sampling, seed=k, user=GivenUser(live, nexts), max_turns=1)
    s.calls.clear()
    score_spy["score"].clear()
    cfg = SeDTConfig(trigger_uncertain_frac=-1.0)  # always trigger (every run has CONFIRMED words)
    infos = sedt_final_turn(s, runs, finals, sampling, cfg=cfg, seed=3)
    assert s.sizes == [3, 3]  # one sampler call for the SeDT turns, one for the corrections
    assert len(score_spy["score"]) == 1  # one scorer call for all turns
    for r, f, info in zip(runs, finals, infos):
        assert len(r.turns) == len(r.user_turns) and r.turns[-1].user == f
        assert info["triggered"]
        words = frozenset().union(*[content_words(sh) for sh, lab in zip(info["annotation"]["shards"],
                                                                          info["annotation"]["labels"]) if lab == C])
        rises = coverage(info["correction"], words) > coverage(info["original"], words)
        assert info["guard"] == "no_answer"
        assert info["replaced"] == (rises and find_numbers(info["original"]) == []
                                    and find_numbers(info["correction"]) != [])
        assert r.turns[-1].assistant == (info["correction"] if info["replaced"] else info["original"])
        assert info["prompt"].count("\n(") == len(r.user_turns)
    # no trigger -> no correction call
    runs2, finals2 = _runs((2, 2, 2))
    run_conversations(s, runs2, sampling, user=GivenUser(runs2, [r.user_turns[0] for r in runs2]), max_turns=1)
    s.calls.clear()
    infos = sedt_final_turn(s, runs2, finals2, sampling, cfg=SeDTConfig(self_correct=False))
    assert s.sizes == [3] and not any(i["triggered"] or i["correction"] for i in infos)


def test_strategy_in_the_lic_simulator(tiny_model):
    from jaxrl_mt.data import synthetic_tasks
    from jaxrl_mt.eval.simulator import Judge, check_strategy, plan_runs, simulate

    assert check_strategy("sedt") is sedt_strategy
    s = _sampler(tiny_model)
    tasks = synthetic_tasks(2, steps=2)  # target + 3 conditions: 4 turns
    runs, _ = plan_runs(tasks, ["full", "sharded"], 2, system="Solve it.")
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    recs = simulate(s, runs, sampling, judge=Judge(), protocol="final_turn", verifier_mode="strict", strategy="sedt")
    assert len(recs) == 8 and len(s.sizes) <= 5
    for rec in recs:
        assert rec["n_turns"] == rec["n_planned_turns"]
        has = ["sedt" in t for t in rec["turns"]]
        if rec["kind"] == "full":
            assert has == [False]  # a single turn is answered plainly
        else:
            assert has == [False, False, False, True]  # only the final turn is SeDT's
            last = rec["turns"][-1]
            assert "label" in last and "correct" in last  # judged and verified like any turn
    # 3 history steps (the full runs answer at step 0 with the sharded ones), one SeDT call (+ corrections)
    assert s.sizes[:4] == [8, 4, 4, 4]


def test_respond_api(tiny_model):
    s = _sampler(tiny_model)
    conv = [{"role": "user", "content": "How many apples does Tom have?"},
            {"role": "assistant", "content": "Tell me more."},
            {"role": "user", "content": "He has 3 apples and buys 4."}]
    out = respond(s, [conv, conv[:1], conv, conv[:1]], sampling=SamplingConfig(max_new_tokens=6), seed=1)
    assert len(out) == 4 and s.sizes[0] == 4
    assert out[0].annotation.shards == ("How many apples does Tom have?", "He has 3 apples and buys 4.")
    assert out[0].text == (out[0].correction if out[0].replaced else out[0].original)
    assert out[1].annotation.labels == (U,)  # one turn: nothing is above the mean

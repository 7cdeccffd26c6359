"""The registered `rlsta` reward: which prompt the anchor is scored under, and the two paper presets' formulas.

The anchor-prompt tests run the real path: an MT-Refine scenario of the shipped RLSTA sample, its
history answered by the tiny chat model (``build_histories``, as training does), the reward built
by name and its reference Scorer; the expected anchor comes from a direct ``Scorer.score`` call
on the prompt that should be used. The preset formulas are checked on a worked example whose
reference log-probs are fixed by hand (:class:`TableScorer`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_mt.rewards.rlsta  # noqa: F401  (registers "rlsta", "grpo")
from configs.rlsta import get_config
from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.rewards.registry import RewardEnv, make_reward
from jaxrl_mt.rl.histories import TrainItem, build_histories
from jaxrl_mt.sampling import GenerationResult, Sampler, SamplingConfig
from jaxrl_mt.scoring import Scorer, ScoreResult
from jaxrl_mt.rl.run_config import typed_config


@pytest.fixture(scope="module")
def refine_item(tiny_model) -> TrainItem:
    """One MT-Refine training item: its history answered by the tiny model, as the trainer builds it."""
    sc = build_scenario(load_source("rlsta_refine:@")[0], "mt_refine")
    m = tiny_model
    s = Sampler(m.params, m.cfg, m.tokenizer, eos_ids=m.eos_ids, pad_id=m.pad_id, max_batch=1)
    (item,) = build_histories(s, [sc], SamplingConfig(max_new_tokens=4), seed=0)
    return item


def _gen(tok, texts: list[str]) -> GenerationResult:
    toks = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return GenerationResult(toks, [np.zeros(len(t), np.float32) for t in toks], np.array([len(t) for t in toks]),
                            ["stop"] * len(texts), texts)


def _direct(scorer: Scorer, tok, messages: list[dict[str, str]], gen: GenerationResult) -> np.ndarray:
    ctx = encode_prompt(tok, messages, system=None)
    return scorer.score([ctx] * len(gen.tokens), gen.tokens).geo_mean


def test_anchor_is_scored_on_the_clean_full_prompt(tiny_model, refine_item):
    it, tok = refine_item, tiny_model.tokenizer
    # what the item holds: a real MT-Refine history, corrections in the merged turns, the clean prompt apart
    assert it.kind == "mt_refine" and len(it.history) == 4 and it.last_user.startswith("Correction")
    assert "$65 per month" in it.merged_user and "$65" not in it.anchor_prompt
    assert it.anchor_prompt.startswith("Calculate the phone bill for next year after a 10% increase.")
    c = get_config("cpu")
    c.rl.alpha, c.rl.verifier_mode = 1.0, "strict"
    scorer = Scorer(tiny_model.params, tiny_model.cfg, pad_id=tiny_model.pad_id, batch_size=4)
    env = RewardEnv(typed_config(c), 2, tok, None, scorer)
    gen = _gen(tok, ["The bill is $660. The answer is 660.", "It is 700."])
    out = make_reward("rlsta", env)([it], gen)
    clean = _direct(scorer, tok, [{"role": "user", "content": it.anchor_prompt}], gen)
    history = _direct(scorer, tok, it.messages, gen)
    merged = _direct(scorer, tok, [{"role": "user", "content": it.merged_user}], gen)
    np.testing.assert_allclose(out.components["anchor"], clean, rtol=1e-5)
    np.testing.assert_allclose(out.rewards, [1.0 + clean[0], clean[1]], rtol=1e-5)
    for other in (history, merged):  # the test can tell them apart: it fails if either were passed
        assert np.max(np.abs(other - clean) / clean) > 1e-3, (other, clean)
    c.rl.anchor_prompt = "merged"  # the official code's context
    env = RewardEnv(typed_config(c), 2, tok, None, scorer)
    np.testing.assert_allclose(make_reward("rlsta", env)([it], gen).components["anchor"], merged, rtol=1e-5)


# --------------------------------------------------------------------------- the presets' formulas by hand


class TableScorer:
    """A reference model with hand-set log-probs: completion ids -> per-token log-probs; records the contexts."""

    def __init__(self, table: dict[tuple[int, ...], list[float]]):
        self.table, self.contexts = table, []

    def score(self, contexts, completions, *, pool="completion") -> ScoreResult:
        self.contexts += [list(c) for c in contexts]
        lps = [np.asarray(self.table[tuple(c)], np.float64) for c in completions]
        mean = np.array([lp.mean() for lp in lps])
        return ScoreResult(lps, np.array([lp.sum() for lp in lps]), mean, np.exp(mean), np.zeros((len(lps), 1)))


TEXTS = ["The answer is 660.", "It is 700.", "#### 660", "I am not sure."] * 2  # G = 8 completions of one item
LOGPS = [[-0.5, -1.5], [-2.0, -2.0], [-0.1, -0.3], [-1.0, -3.0]]  # per distinct completion: mean -1, -2, -0.2, -2


def _worked_example(embedded_model, preset: str):
    tok = embedded_model.tokenizer
    gen = _gen(tok, TEXTS)
    # every distinct completion has n >= 2 tokens: n - 1 of them get LOGPS[0], the last one what makes the mean
    # that of LOGPS (n * mean - (n - 1) * LOGPS[0])
    table = {}
    for text, lp in zip(TEXTS[:4], LOGPS):
        ids = tuple(gen.tokens[TEXTS.index(text)])
        n, mean = len(ids), (lp[0] + lp[1]) / 2
        assert n >= 2
        table[ids] = [lp[0]] * (n - 1) + [n * mean - (n - 1) * lp[0]]
    c = get_config(preset)
    assert c.rl.group_size == 8 and c.rl.verifier_mode == "lenient"
    scorer = TableScorer(table)
    out = make_reward(c.reward, RewardEnv(typed_config(c), 8, tok, None, scorer))([_refine_item()], gen)
    return out, scorer, tok


def _refine_item() -> TrainItem:
    sc = build_scenario(load_source("rlsta_refine:@")[0], "mt_refine")
    return TrainItem(item_id="gsm8k/0|mt_refine|0", task_id="gsm8k/0", kind="mt_refine",
                     history=(("user", sc.turns[0]), ("assistant", "It is $780."), ("user", sc.turns[1]),
                              ("assistant", "It is $600.")), last_user=sc.turns[2], anchor_prompt=sc.anchor_prompt,
                     merged_user="\n".join(sc.turns), answer=sc.answer)


def test_paper_preset_reward_is_the_official_formula(embedded_model):
    """`paper`: R = R_v + exp(mean logp) / G under the merged user turns, wrong answers keep their anchor."""
    out, scorer, tok = _worked_example(embedded_model, "paper")
    g = 8
    # by hand: exp(-1) / 8 = 0.0459849, exp(-2) / 8 = 0.0169169, exp(-0.2) / 8 = 0.1023413
    rs = [math.exp(-1.0), math.exp(-2.0), math.exp(-0.2), math.exp(-2.0)] * 2
    rv = [1.0, 0.0, 1.0, 0.0] * 2  # lenient verifier against 660
    want = [v + s / g for v, s in zip(rv, rs)]
    np.testing.assert_allclose(out.rewards, want, rtol=1e-12)
    np.testing.assert_allclose(out.rewards[:4], [1.0459849, 0.0169169, 1.1023413, 0.0169169], atol=1e-7)
    item = _refine_item()
    merged = encode_prompt(tok, [{"role": "user", "content": item.merged_user}], system=None)
    assert scorer.contexts == [merged] * 8  # the merged user turns, corrupted $65 and corrections included
    assert "$65 per month" in tok.decode(merged)


def test_paper_described_preset_reward(embedded_model):
    """`paper_described`: R = R_v + 1.0 R_s under the clean full prompt, R_s of wrong answers zeroed."""
    out, scorer, tok = _worked_example(embedded_model, "paper_described")
    rs = [math.exp(-1.0), 0.0, math.exp(-0.2), 0.0] * 2  # the group holds a correct answer: wrong ones zeroed
    np.testing.assert_allclose(out.rewards, [1.0 + rs[0], 0.0, 1.0 + rs[2], 0.0] * 2, rtol=1e-12)
    np.testing.assert_allclose(out.rewards[:3], [1.3678794, 0.0, 1.8187308], atol=1e-7)
    clean = encode_prompt(tok, [{"role": "user", "content": _refine_item().anchor_prompt}], system=None)
    assert scorer.contexts == [clean] * 8


def test_paper_presets_settings():
    paper, described, cpu = get_config("paper"), get_config("paper_described"), get_config("cpu")
    assert (paper.rl.alpha, paper.rl.loss_type, paper.rl.anchor_prompt, paper.rl.zero_anchor_for_wrong) == \
        (1 / 8, "dapo", "merged", False)
    assert (described.rl.alpha, described.rl.loss_type, described.rl.anchor_prompt,
            described.rl.zero_anchor_for_wrong) == (1.0, "grpo", "full", True)
    for k in ("lr", "batch_size", "group_size", "beta", "max_new_tokens", "verifier_mode"):
        assert paper.rl[k] == described.rl[k], k  # everything else is shared
    assert (cpu.rl.loss_type, cpu.rl.anchor_prompt) == ("grpo", "full")  # other presets unchanged
    presets = ("unknown preset 'papers'; expected 'paper', 'paper_described', 'paper_shapes', 'cpu', 'experiment', "
               "'experiment2', 'experiment3', 'experiment3_official', 'no_verifier' or 'no_verifier_cpu'$")
    with pytest.raises(ValueError, match=presets):
        get_config("papers")


def test_alpha_acts_only_in_groups_with_two_correct_answers():
    """The reading of the alpha ablation (docs/results/experiment.md): with group-normalised advantages
    and the wrong-answer mask, alpha cancels in a group with no correct answer (rewards alpha x R_s)
    and in one with a single correct answer (rewards [1 + alpha s, 0, 0]: z-scores [2, -1, -1] / sqrt(3)
    for any alpha); only a group with two or more correct answers ranks them by alpha x R_s."""
    from jaxrl_mt.rewards.anchor import zero_anchor_for_wrong
    from jaxrl_mt.rl.grpo import group_advantages

    rv = np.array([0, 0, 0, 1, 0, 0, 1, 1, 0], np.float64)  # groups: none, one, two correct
    rs = zero_anchor_for_wrong(np.array([0.2, 0.3, 0.4, 0.5, 0.3, 0.4, 0.5, 0.3, 0.4]), rv, 3)
    adv = {a: np.asarray(group_advantages(jnp.asarray(rv + a * rs, jnp.float32), 3, eps=0.0)) for a in (0.5, 1.0, 2.0)}
    np.testing.assert_allclose(adv[1.0][:3], [-1.0, 0.0, 1.0], atol=1e-5)  # z-scores of R_s alone
    np.testing.assert_allclose(adv[1.0][3:6], np.array([2, -1, -1]) / np.sqrt(3), atol=1e-5)
    for a in (0.5, 2.0):
        np.testing.assert_allclose(adv[a][:6], adv[1.0][:6], atol=1e-5)  # alpha cancels in both
        assert abs(adv[a][6] - adv[a][7]) > 0.05 and abs(adv[a][6] - adv[1.0][6]) > 1e-3  # and acts here
    # with TRL's eps = 1e-4 the cancellation holds up to eps / group std (here 2e-3 at most)
    near = {a: np.asarray(group_advantages(jnp.asarray(rv + a * rs, jnp.float32), 3)) for a in (0.5, 2.0)}
    np.testing.assert_allclose(near[0.5][:6], near[2.0][:6], atol=3e-3)
    assert np.max(np.abs(near[0.5][:6] - near[2.0][:6])) > 1e-6  # but not exactly: a seed of divergence at T = 1

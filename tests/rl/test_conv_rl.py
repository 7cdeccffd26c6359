"""RL over whole simulated conversations (method ``rlsta_conv``, issue 55): the rollout is the LiC
evaluation's conversation, the per-turn rewards and advantages are the hand-worked ones, the loss
reads assistant tokens only, and the CPU preset trains to an export (tiny chat model)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import rlsta_conv
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.eval.judging import make_judge
from jaxrl_mt.models.registry import load_model
from jaxrl_mt.rewards.conversation import TurnGenerations, conversation_turn_reward
from jaxrl_mt.rewards.registry import RewardEnv
from jaxrl_mt.rl.conv_credit import advantages, turn_matrix
from jaxrl_mt.rl.conv_objective import turn_example
from jaxrl_mt.rl.conv_recipe import lic_metrics, split_tasks
from jaxrl_mt.rl.conv_rollout import ConvRollout, TurnItem, run_conversation_groups
from jaxrl_mt.rl.data import validate_config
from jaxrl_mt.rl.step import loss_config, loss_fn
from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.scoring import Scorer


def _config(model: Path, wd: Path):
    c = rlsta_conv.get_config("cpu")
    c.model, c.workdir = str(model), str(wd)
    c.data.add_source, c.data.limit, c.data.heldout = "synthetic:6:0", 6, 2
    c.rl.max_new_tokens, c.eval.max_new_tokens, c.rl.group_size, c.rl.batch_size = 6, 6, 3, 2
    return c


def test_the_rollout_is_the_lic_evaluations_conversation(tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    """Same problems, seed and temperature: the rollout's transcripts are `evaluate`'s, turn for turn."""
    from configs import eval_lic
    from jaxrl_mt.evaluate import evaluate

    model = load_model(str(tiny_chat_model_dir))
    tasks = load_source("synthetic:2:0")
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    ro = run_conversation_groups(Sampler.from_model(model, max_batch=16, row_multiple=8), tasks, 3, sampling,
                                 judge=make_judge("rule"), verifier_mode="strict", seed=1234, system=None)
    c = eval_lic.get_config("cpu")
    c.workdir, c.dataset, c.scenarios, c.runs, c.seed = str(tmp_path / "ev"), ("synthetic:2:0",), ("sharded",), 3, 1234
    c.max_new_tokens, c.temperature, c.verifier_mode, c.plots, c.bootstrap = 6, 1.0, "strict", False, 20
    evaluate(c, model=model, log=lambda m: None)
    got = {r["conv_id"]: r for r in map(json.loads, (tmp_path / "ev" / "transcripts.jsonl").read_text().splitlines())}
    assert len(ro.records) == len(got) == 6 and [r.conv_id for r in ro.runs][:3] == [
        f"{tasks[0].task_id}|sharded|{k}" for k in range(3)]
    for rec in ro.records:
        ev = got[rec["conv_id"]]
        assert [t["assistant"] for t in rec["turns"]] == [t["assistant"] for t in ev["turns"]]
        assert [t["user"] for t in rec["turns"]] == [t["user"] for t in ev["turns"]]
        assert (rec["score"], rec["stop_reason"]) == (ev["score"], ev["stop_reason"])
    assert len({t["assistant"] for r in ro.records for t in r["turns"]}) > 3  # sampled: the replies differ
    # the turn rows: one per assistant turn, each prompt the turn's whole chat, each completion its reply
    assert len(ro.items) == sum(len(r.turns) for r in ro.runs)
    tok = model.tokenizer
    for it, p, comp in zip(ro.items, ro.prompts, ro.completions):
        run = ro.runs[it.conv]
        assert comp == run.turns[it.turn].tokens
        assert tok.decode(p).rstrip().endswith(tok.decode(tok.encode(run.turns[it.turn].user)).strip()) or \
            run.turns[it.turn].user.split()[-1] in tok.decode(p)


def test_per_turn_rewards_and_both_advantages_are_the_hand_worked_ones(tiny_chat_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    """2 problems x G 3, up to 3 turns: right +1, wrong -0.5, no attempt 0; clarify 0.25 while incomplete;
    outcome 1 on a right last turn; alpha 0 here (the anchor is checked against anchor_scores below)."""
    c = _config(tiny_chat_model_dir, tmp_path / "wd")
    c.rlsta_conv.wrong_penalty, c.rlsta_conv.clarify_weight, c.rlsta_conv.outcome_weight = -0.5, 0.25, 1.0
    c.rl.alpha = 0.0
    tc = validate_config(c)
    R, W, Q = "The answer is 12.", "The answer is 7.", "What is the price?"
    # (conv, turn, text, attempt, complete, last, label)
    plan = [(0, 0, Q, False, False, False, "clarification"), (0, 1, W, True, False, False, ""),
            (0, 2, R, True, True, True, ""),  # 0.25, -0.5, 1 + 1
            (1, 0, W, True, False, False, ""), (1, 1, R, True, False, True, ""),  # -0.5, 1 + 1 (right, last)
            (2, 0, Q, False, False, False, "clarification"), (2, 1, Q, False, False, False, "clarification"),
            (2, 2, W, True, True, True, ""),  # 0.25, 0.25, -0.5
            (3, 0, R, True, False, True, ""),  # 1 + 1
            (4, 0, Q, False, False, False, "discussion"), (4, 1, W, True, False, False, ""),
            (4, 2, W, True, True, True, ""),  # 0 (discussion is a non-answer too: 0.25), -0.5, -0.5
            (5, 0, W, True, False, False, ""), (5, 1, R, True, True, True, "")]  # -0.5, 2
    items = [TurnItem(f"c{cv}|{k}", cv, k, "12", f"s{k}", comp, last, lab or "answer_attempt", att)
             for cv, k, _, att, comp, last, lab in plan]
    gens = TurnGenerations([p[2] for p in plan], [[5, 6]] * len(plan))
    model = load_model(str(tiny_chat_model_dir))
    env = RewardEnv(tc, 1, model.tokenizer, None, Scorer(model.params, model.cfg, pad_id=model.pad_id))
    out = conversation_turn_reward(env, items, gens)
    want = [0.25, -0.5, 2.0, -0.5, 2.0, 0.25, 0.25, -0.5, 2.0, 0.25, -0.5, -0.5, -0.5, 2.0]
    np.testing.assert_allclose(out.rewards, want, atol=1e-12)
    assert out.components["anchor"].shape == (14,) and np.all((out.components["anchor"] > 0)
                                                                & (out.components["anchor"] < 1))
    rewards, mask = turn_matrix([[0.25, -0.5, 2.0], [-0.5, 2.0], [0.25, 0.25, -0.5], [2.0], [0.25, -0.5, -0.5],
                                 [-0.5, 2.0]])
    # trajectory: returns 1.75, 1.5, 0 | 2, -0.75, 1.5; unscaled: minus the group means 3.25/3 and 2.75/3
    traj = advantages(rewards, mask, 3, credit="trajectory", gamma=1.0, scale_rewards=False)
    np.testing.assert_allclose(traj[:, 0], [1.75 - 13 / 12, 1.5 - 13 / 12, -13 / 12,
                                            2 - 11 / 12, -0.75 - 11 / 12, 1.5 - 11 / 12], atol=1e-9)
    # turn-level, turn 1 of problem 0: rewards-to-go 1.5 (conv 0), 2 (conv 1), -0.25 (conv 2): mean 3.25 / 3
    turn = advantages(rewards, mask, 3, credit="turn", gamma=1.0, scale_rewards=False)
    np.testing.assert_allclose(turn[:3, 1], [1.5 - 3.25 / 3, 2 - 3.25 / 3, -0.25 - 3.25 / 3], atol=1e-9)
    # turn 2 of problem 1: conv 4 (-0.5) alone -> 0; turn 1: conv 4 (-1) and conv 5 (2), mean 0.5
    np.testing.assert_allclose([turn[4, 2], turn[4, 1], turn[5, 1]], [0.0, -1.5, 1.5], atol=1e-9)


def test_the_loss_reads_assistant_tokens_only(tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    """The turn rows' GRPO loss (dapo, on-policy, beta 0) equals -sum_rows A_r n_r / N over the replies'
    tokens, and its gradient equals that of the same sum of the replies' own log-probs computed by
    hand from [prompt | reply] (so no user or template token is a target)."""
    c = _config(tiny_chat_model_dir, tmp_path / "wd")
    c.rl.beta = 0.0
    tc = validate_config(c)
    model = load_model(str(tiny_chat_model_dir))
    tok = model.tokenizer
    chats = [[{"role": "user", "content": "Ann has 3 apples."}],
             [{"role": "user", "content": "Ann has 3 apples."}, {"role": "assistant", "content": "ok"},
              {"role": "user", "content": "She buys 4 more. How many?"}]]
    from jaxrl_mt.chat import encode_prompt

    prompts = [encode_prompt(tok, ch) for ch in chats]
    replies = [[1, 2, 3], [4, 5, 6, 7, 8]]
    items = [TurnItem("a|0", 0, 0, "7", "x", False, False, "x", False), TurnItem("a|1", 0, 1, "7", "x", True, True,
                                                                                 "x", True)]
    ro = ConvRollout([], [], items, prompts, replies, 0.0)
    adv = np.array([0.5, -1.25], np.float32)
    ex = turn_example(ro, adv, model.pad_id, rows=4, max_new=8)
    assert ex.rows == 4 and ex.completion_mask.sum() == 8 and ex.completion_mask[2:].sum() == 0
    lc = loss_config(tc.rl)
    from jaxrl_mt.rl.step import dapo_num_items

    ex = ex.replace(num_items=dapo_num_items(ex.completion_mask, 1, 8))
    loss, _ = loss_fn(model.params, model.cfg, lc, ex)
    np.testing.assert_allclose(float(loss), -(0.5 * 3 - 1.25 * 5) / 8, rtol=1e-6)

    from jaxrl_mt.models.decoder import forward

    def by_hand(params):
        total = 0.0
        for p, r, a in zip(prompts, replies, adv):
            ids = jnp.asarray([p + r])
            logits = forward(params, model.cfg, ids, jnp.arange(ids.shape[1])[None], jnp.ones_like(ids))[0]
            lp = jax.nn.log_softmax(logits[0, len(p) - 1:-1].astype(jnp.float32), -1)
            lp = jnp.take_along_axis(lp, jnp.asarray(r)[:, None], -1)[:, 0]
            total = total - a * jnp.sum(jnp.exp(lp - jax.lax.stop_gradient(lp)))
        return total / 8

    g1 = jax.grad(lambda q: loss_fn(q, model.cfg, lc, ex)[0])(model.params)
    g2 = jax.grad(by_hand)(model.params)
    diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, y: float(jnp.abs(x - y).max()), g1, g2))
    scale = max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(g2))
    assert scale > 0 and max(diffs) <= 1e-4 * scale


def test_held_out_problems_are_not_trained_on_and_lic_metrics_are_lic_s() -> None:
    tasks = load_source("synthetic:12:0")
    train, held = split_tasks(tasks, 4, seed=3)
    assert len(held) == 4 and not {t.task_id for t in train} & {t.task_id for t in held}
    assert {t.task_id for t in train} | {t.task_id for t in held} == {t.task_id for t in tasks}
    recs = [{"kind": "sharded", "task_id": "a", "score": s} for s in (1, 0, 0, 0)] + \
           [{"kind": "sharded", "task_id": "b", "score": s} for s in (1, 1, 1, 1)]
    m = lic_metrics(recs)
    assert m["eval/lic_sharded_P"] == pytest.approx((25 + 100) / 2)


@pytest.mark.slow  # ~1 min on 2 idle cores: the held-out LiC metrics before and after, 2 steps, an export
def test_the_cpu_preset_trains_two_steps_to_an_export(tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    from jaxrl_mt.rl.loop import Trainer
    from jaxrl_mt.rl.policy_io import load_policy

    wd = tmp_path / "run"
    c = _config(tiny_chat_model_dir, wd)
    c.rl.steps, c.checkpoint.every = 2, 1
    Trainer(c, log=lambda m: None).run()
    rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["conv/turns"] >= 1 and "reward/anchor" in r and "reward/verifier" in r
    evals = [r for r in rows if "eval/lic_sharded_P" in r]
    assert [r["step"] for r in evals] == [0, 2] and all("eval/lic_full_U90_10" in r for r in evals)
    exported = load_model(str(wd / "export"))
    trained = load_policy(wd)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6),
                           exported.params, trained.params)
    assert (wd / "curves.png").is_file() and (wd / "train_tasks.jsonl").is_file()
    convs = [json.loads(x) for x in (wd / "conversations.jsonl").read_text().splitlines()]
    assert [r["step"] for r in convs] == [1] * 6 + [2] * 6  # batch 2 x G 3 per step
    for r in convs:
        assert r["kind"] == "sharded" and r["turns"]
        assert all({"user", "assistant", "reward", "advantage", "r_verifier", "r_anchor"} <= set(t) for t in r["turns"])
    for step, r in zip((1, 2), train):  # the log's rewards are the step's
        rewards = [t["reward"] for c in convs if c["step"] == step for t in c["turns"]]
        assert np.mean(rewards) == pytest.approx(r["reward/total"], rel=1e-6)


def _train_rows(wd: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r for r in rows if "train/loss" in r}


@pytest.mark.slow  # three training runs in subprocesses (~4 min on 2 cores)
def test_a_run_killed_with_sigkill_resumes_with_identical_metrics(tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    """kill -9 after the second checkpoint, then a resume: every step's metrics equal an uninterrupted run's,
    and conversations.jsonl holds each step's conversations once."""
    import math
    import os
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    script = ("import sys; from pathlib import Path; from tests.rl.test_conv_rl import _config; "
              "from jaxrl_mt.rl.loop import Trainer; c = _config(Path(sys.argv[1]), Path(sys.argv[2])); "
              "c.rl.steps, c.checkpoint.every, c.data.heldout, c.export = 4, 1, 0, False; Trainer(c).run()")
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}

    def train(wd: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", script, str(tiny_chat_model_dir), str(wd)], cwd=root, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    assert train(tmp_path / "full").wait(900) == 0
    proc = train(tmp_path / "killed")
    deadline = time.monotonic() + 900
    while not (tmp_path / "killed" / "checkpoints" / "2").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    assert train(tmp_path / "killed").wait(900) == 0
    a, b = _train_rows(tmp_path / "full"), _train_rows(tmp_path / "killed")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        for k, v in a[step].items():
            if not k.startswith("perf/") and isinstance(v, float):
                assert math.isclose(v, b[step][k], rel_tol=1e-6, abs_tol=1e-6), (step, k)
    logs = [[json.loads(x) for x in (tmp_path / d / "conversations.jsonl").read_text().splitlines()]
            for d in ("full", "killed")]
    assert [r["step"] for r in logs[1]] == [r["step"] for r in logs[0]] == [s for s in (1, 2, 3, 4) for _ in range(6)]
    assert [[t["assistant"] for t in r["turns"]] for r in logs[0]] == [[t["assistant"] for t in r["turns"]]
                                                                      for r in logs[1]]

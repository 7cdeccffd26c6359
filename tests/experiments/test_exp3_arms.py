"""experiments.exp3_arms: the plan's arm table (seeds, order, data stage) and every arm's command is a config
the trainer accepts, from the stage-0 model at the plan's budget, prompt, LoRA and selection rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from experiments import arm_runs, exp3
from experiments.exp3_arms import ARMS, PLAN
from jaxrl_mt.rl.run_config import typed_config
from jaxrl_mt.runtime import load_config_file

ROOT = Path(__file__).resolve().parents[2]


def _arm_config(name: str):
    """Arm ``name``'s config as its ``train_arm`` command makes it (preset, then the ``--config.`` overrides)."""
    args = arm_runs.arm_command(PLAN, name, Path("runs/exp3"), Path("docs/results/exp3/items"))
    file, preset = args[1].split(":")
    c = load_config_file(ROOT / file, preset)
    for a in args[2:]:
        key, value = a.removeprefix("--config.").split("=", 1)
        *path, leaf = key.split(".")
        node = c
        for p in path:
            node = node[p]
        old = node[leaf]
        node[leaf] = value if isinstance(old, str) else type(old)(ast.literal_eval(value))
    return c


def test_the_table_is_the_plans_seeds_in_order() -> None:
    seeds: dict[str, list[int]] = {}
    for name, arm in ARMS.items():
        assert name.endswith(f"_s{arm.seed}")
        seeds.setdefault(name.rsplit("_s", 1)[0], []).append(arm.seed)
    assert seeds == {"rlsta": [0, 1, 2], "grpo": [0, 1, 2], "rlsta_official": [0, 1, 2], "sft": [0, 1, 2],
                     "dpo": [0, 1], "rlsta_nv": [0, 1], "icpo": [0, 1], "rlaar": [0, 1], "conv": [0, 1]}
    assert list(ARMS)[0] == PLAN.data_arm == "rlsta_s0"  # the data stage runs first
    assert [a.seed for a in ARMS.values()] == sorted(a.seed for a in ARMS.values())  # every seed 0 first
    assert {n for n, a in ARMS.items() if not a.shares_items} == {f"{m}_s{s}" for m in ("icpo", "rlaar", "conv")
                                                                    for s in (0, 1)}
    assert {n for n, a in ARMS.items() if a.shares_texts} == {"sft_s0", "sft_s1", "sft_s2", "dpo_s0", "dpo_s1"}


@pytest.mark.parametrize("name", [n for n in ARMS if n.endswith("_s0")])
def test_every_arm_is_a_valid_config_from_stage0_under_the_plans_rules(name: str) -> None:
    t = _arm_config(name)
    typed_config(t).check()  # what the trainer refuses at start-up (e.g. the wrong-answer mask without a verifier)
    assert t.model == "runs/exp3/stage0/export" and t.workdir == f"runs/exp3/{name}"
    assert t.lora.rank == 16 and t.lora.alpha == 32.0 and t.rl.lr == 1e-4
    assert t.rl.max_new_tokens == t.eval.max_new_tokens == 64
    assert t.eval.probe_source == "tasks:docs/results/exp3/data/probe.jsonl"
    assert t.eval.select == "probe/multi_turn_strict:max" and t.eval.probe_kinds == "sharded,mt_refine"
    assert t.system_prompt.startswith(exp3.system_prompt())  # RLAAR appends its abstain instruction
    assert (t.system_prompt == exp3.system_prompt()) == (not name.startswith("rlaar"))
    problems = ("tasks:docs/results/exp3/items/train_problems.jsonl" if not ARMS[name].shares_items
                else "tasks:docs/results/exp3/data/arms.jsonl")
    assert t.data.add_source == problems
    if name.startswith(("rlsta", "grpo", "rlsta_nv")):  # the RL arms on histories: the same steps x batch x G
        assert (t.rl.steps, t.rl.batch_size, t.rl.group_size) == (36, 4, 6)
    if name == "rlsta_nv_s0":
        assert t.rl.verifier_weight == 0.0 and not t.rl.zero_anchor_for_wrong and t.rl.alpha == 1.0


def test_the_two_rlsta_arms_and_grpo_differ_only_in_the_reward() -> None:
    desc, code, grpo = (_arm_config(n).to_dict() for n in ("rlsta_s0", "rlsta_official_s0", "grpo_s0"))
    assert desc["rl"]["alpha"] == 1.0 and code["rl"]["alpha"] == 1 / 6 and grpo["rl"]["alpha"] == 0.0
    for k in ("steps", "batch_size", "group_size", "lr", "temperature", "beta", "max_new_tokens"):
        assert desc["rl"][k] == code["rl"][k] == grpo["rl"][k], k


def test_the_comparison_gives_every_model_the_plans_settings(tmp_path: Path) -> None:
    from experiments import exp3_eval

    results = tmp_path / "results"
    (results / "rlsta_s0" / "adapter").mkdir(parents=True)
    (results / "rlsta_s0" / "adapter" / "adapter_config.json").write_text("{}")
    names = ["rlsta_s0", "rlsta_s1", "rlaar_s0"]
    c = exp3_eval.comparison(names, tmp_path / "runs", results, tmp_path / "r.md")
    models = dict(m.split("=", 1) for m in c.models if "=" in m)
    assert c.base == "runs/exp3/stage0/export" and c.models[0] == "base"
    assert models["original"] == "builtin:smollm2-135m-instruct"
    assert models["rlsta_s0"] == f"runs/exp3/stage0/export+lora:{results}/rlsta_s0/adapter"  # the committed adapter
    assert models["rlsta_s1"] == f"workdir:{tmp_path}/runs/rlsta_s1"
    assert models["sedt"] == models["recap"] == models["base_abstain"] == c.base
    assert (c.max_new_tokens, c.system, c.heldout) == (64, exp3.system_prompt(), "docs/results/exp3/data/heldout.jsonl")
    assert set(c.greedy_only) == {"original", "rlsta_s1", "sedt", "recap", "base_abstain"}  # LiC: base and seeds 0
    assert set(c.abstain_models) == {"rlaar_s0", "base_abstain"} and c.pairs == ("rlaar_s0:base_abstain",)
    greedy = exp3_eval.comparison(names, tmp_path / "runs", results, tmp_path / "r.md", Path("p.jsonl"), lic=False)
    assert greedy.lic_runs == 0 and greedy.heldout == "p.jsonl" and "base" in greedy.greedy_only


def test_sft_and_dpo_steps_are_the_papers_epochs_of_the_committed_items() -> None:
    """SFT: 5 epochs, DPO: 1, of the data stage's seed-0 training rows (one per filtered item: its single-turn
    sample is right more often than its multi-turn one, so it has a right and a wrong sample), in quarters."""
    from jaxrl_mt.rl.histories import load_items
    from jaxrl_mt.rl.sft_data import split_validation

    items = load_items(ROOT / "docs/results/exp3/items/train_items.jsonl")
    train, _ = split_validation(items, 0.1, 0)
    sft, dpo = _arm_config("sft_s0"), _arm_config("dpo_s0")
    assert (sft.sft.val_fraction, dpo.dpo.val_fraction) == (0.1, 0.1)
    assert abs(sft.rl.steps * 4 / len(train) - 5) < 0.05 and abs(dpo.rl.steps * 4 / len(train) - 1) < 0.06
    for c in (sft, dpo):
        assert c.rl.batch_size == 4 and c.rl.steps % 4 == 0
        assert c.eval.probe_every == c.checkpoint.every == c.rl.steps // 4


def test_the_cli_names_its_mistakes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        exp3.main(["reproduce"])
    assert e.value.code == 2 and "reproduce: name the arms" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--arms: unknown \['gpro_s0'\]"):
        exp3.main(["train", "--arms", "gpro_s0"])
    with pytest.raises(SystemExit) as e:
        exp3.main(["train", "--limit", "3"])  # compare's options go to evaluate only
    assert e.value.code == 2 and "unrecognized arguments: --limit 3" in capsys.readouterr().err
    assert exp3.main(["list", "--arms", "grpo_s1", "--runs", "/nonexistent"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["grpo_s1", "to"]

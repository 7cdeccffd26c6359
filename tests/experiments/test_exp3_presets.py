"""Experiment 3's presets (configs/rlsta.py ``experiment3`` / ``experiment3_official``): refused until the
plan's budget is chosen, then the stage-0 model, the committed subsets, the selection rule, and the two
RLSTA readings differing only where the paper and its code differ."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from jaxrl_mt.runtime import load_config_file
from tests.experiments.test_presets import CONFIGS, _flat


@pytest.fixture
def budgeted(tmp_path: Path) -> Path:
    """configs/ copied with a budget chosen (96), as it is once `experiments.exp3 premise` has run."""
    for f in ("rlsta.py", "grpo.py"):
        shutil.copyfile(CONFIGS / f, tmp_path / f)
    text = (tmp_path / "rlsta.py").read_text()
    (tmp_path / "rlsta.py").write_text(re.sub(r"^EXP3_BUDGET = \d+", "EXP3_BUDGET = 96", text, flags=re.M))
    return tmp_path


def test_the_committed_budget_is_the_premise_run_s_choice(tmp_path: Path) -> None:
    """EXP3_BUDGET is what `experiments.exp3 premise` chose (premise.json); with 0 (not run) it is refused."""
    text = (CONFIGS / "rlsta.py").read_text()
    budget = int(re.search(r"^EXP3_BUDGET = (\d+)", text, re.M).group(1))
    premise = json.loads((CONFIGS.parent / "docs/results/exp3/premise/premise.json").read_text())
    assert budget == premise["budget"] == 64
    (tmp_path / "rlsta.py").write_text(re.sub(r"^EXP3_BUDGET = \d+", "EXP3_BUDGET = 0", text, flags=re.M))
    with pytest.raises(ValueError, match="experiment3: the reply budget is not chosen yet"):
        load_config_file(tmp_path / "rlsta.py", "experiment3")


def test_every_arm_starts_from_stage0_on_the_subsets(budgeted: Path) -> None:
    c = _flat(load_config_file(budgeted / "rlsta.py", "experiment3").to_dict())
    assert c["model"] == "runs/exp3/stage0/export"
    assert c["data.add_source"] == c["data.refine_source"] == "tasks:docs/results/exp3/data/arms.jsonl"
    assert c["eval.probe_source"] == "tasks:docs/results/exp3/data/probe.jsonl"  # validation, never held-out
    assert {c["history.max_new_tokens"], c["rl.max_new_tokens"], c["eval.max_new_tokens"]} == {96}
    assert c["eval.select"] == "probe/multi_turn_strict:max"
    assert c["rl.steps"] % c["eval.probe_every"] == 0 and c["eval.probe_every"] == c["checkpoint.every"]
    assert c["lora.rank"] == 16 and c["rl.lr"] == 1e-4
    for name in ("arms.jsonl", "probe.jsonl"):
        assert (CONFIGS.parent / "docs/results/exp3/data" / name).is_file()


def test_the_two_rlsta_readings_differ_only_in_the_papers_four_settings(budgeted: Path) -> None:
    desc = _flat(load_config_file(budgeted / "rlsta.py", "experiment3").to_dict())
    code = _flat(load_config_file(budgeted / "rlsta.py", "experiment3_official").to_dict())
    diff = {k for k in desc.keys() | code.keys() if desc.get(k) != code.get(k)}
    assert diff == {"workdir", "rl.alpha", "rl.loss_type", "rl.anchor_prompt", "rl.zero_anchor_for_wrong"}
    assert (desc["rl.alpha"], desc["rl.zero_anchor_for_wrong"], desc["rl.anchor_prompt"]) == (1.0, True, "full")
    assert (code["rl.alpha"], code["rl.zero_anchor_for_wrong"]) == (1.0 / code["rl.group_size"], False)
    grpo = _flat(load_config_file(budgeted / "grpo.py", "experiment3").to_dict())
    assert {k for k in desc if desc[k] != grpo.get(k)} == {"method", "reward", "rl.alpha", "workdir"}

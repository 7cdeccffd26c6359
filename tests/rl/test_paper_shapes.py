"""configs/rlsta.py:paper_shapes, the device preset: `paper`'s recipe at a synthetic model's shapes, in bf16,
run to an export on `random:tiny` with the step's phase split logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from configs.rlsta import get_config

ROOT = Path(__file__).resolve().parents[2]
PHASE_KEYS = ("perf/rollout_s", "perf/rollout_tokens_per_s", "perf/anchor_s", "perf/anchor_tokens_per_s",
              "perf/reference_s", "perf/reference_tokens_per_s", "perf/update_s", "perf/update_tokens_per_s",
              "perf/update_tflops", "perf/compile_s", "perf/step_s")
# CPU smoke: the preset on the tiny synthetic model, one MT-Add problem, short budgets, G = 8 kept
SMOKE = {"model": "random:tiny", "rl.steps": 2, "data.limit": 1, "data.refine_source": "", "history.max_new_tokens": 4,
         "rl.batch_size": 1, "rl.grad_accum": 1, "rl.max_new_tokens": 8}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_the_preset_is_papers_recipe_at_shapes():
    paper, shapes = _flat(get_config("paper").to_dict()), _flat(get_config("paper_shapes").to_dict())
    changed = {k for k in paper if paper[k] != shapes[k]}
    assert changed == {"workdir", "model", "param_dtype", "dtype", "filter.enabled", "data.limit", "data.heldout",
                       "rl.steps", "rl.grad_accum", "log.samples_every", "checkpoint.every", "checkpoint.keep"}
    assert (shapes["model"], shapes["param_dtype"], shapes["dtype"], shapes["rl.remat"]) == (
        "random:qwen2.5-1.5b", "bfloat16", "bfloat16", "auto")
    assert (shapes["rl.group_size"], shapes["rl.max_new_tokens"], shapes["history.max_new_tokens"]) == (8, 1024, 256)
    assert (shapes["rl.alpha"], shapes["rl.loss_type"], shapes["rl.anchor_prompt"]) == (1 / 8, "dapo", "merged")
    assert shapes["rl.batch_size"] * shapes["rl.group_size"] // shapes["rl.grad_accum"] == 8  # one group per micro
    from jaxrl_mt.rl.loop import validate_config
    from jaxrl_mt.rl.rollout import grouped_layout
    from jaxrl_mt.rl.run_config import typed_config

    c = typed_config(get_config("paper_shapes"))  # the defaults are accepted as they are
    validate_config(c)
    assert grouped_layout(c.rl.batch_size, c.rl.rollout.group_size, c.rl.grad_accum)  # prompts once per group


def _check_run(workdir: Path, log: str) -> None:
    rows = {r["step"]: r for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
            if r.get("kind") == "train"}
    assert sorted(rows) == [1, 2]
    for r in rows.values():
        assert all(k in r for k in PHASE_KEYS), sorted(set(PHASE_KEYS) - set(r))
        assert "perf/update_mfu" not in r and "perf/peak_memory_gib" not in r  # CPU: no peak, no memory stats
        assert r["perf/anchor_s"] > 0 and r["perf/step_s"] >= r["perf/rollout_s"] + r["perf/update_s"]
    # step 2 has step 1's shapes (the same problem): it compiles (almost) nothing
    assert rows[1]["perf/compile_s"] > 1.0 and rows[2]["perf/compile_s"] < rows[1]["perf/compile_s"] / 4
    for step in (1, 2):
        assert f"step {step} phases: rollout " in log and "MFU n/a" in log and "peak memory n/a" in log
    exported = json.loads((workdir / "export" / "config.json").read_text())
    assert (exported["architectures"], exported["hidden_size"], exported["num_key_value_heads"],
            exported["vocab_size"], exported["torch_dtype"]) == (["Qwen2ForCausalLM"], 64, 2, 49152, "bfloat16")
    assert (workdir / "export" / "tokenizer.json").is_file()


def test_paper_shapes_trains_random_tiny_to_an_export(tmp_path, capsys):
    """In process (the CLI's path below is the slow test): two steps, the phases logged, and the trainer's
    sampler generates greedily what a fresh Sampler of a fresh load of the spec does."""
    from jaxrl_mt.chat import encode_prompt
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.rl.loop import Trainer
    from jaxrl_mt.sampling import Sampler, SamplingConfig

    c = get_config("paper_shapes")
    c.workdir = str(tmp_path / "run")
    for key, value in SMOKE.items():
        section, _, name = key.rpartition(".")
        setattr(c[section] if section else c, name, value)
    trainer = Trainer(c)
    prompt = encode_prompt(trainer.tok, [{"role": "user", "content": "What is 2 + 3?"}])
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    ours = trainer.sampler.generate_ids([prompt], greedy, stop_ids=[[]])
    fresh = load_model("random:tiny", param_dtype="bfloat16", dtype="bfloat16")
    theirs = Sampler.from_model(fresh).generate_ids([prompt], greedy, stop_ids=[[]])
    np.testing.assert_array_equal(ours.tokens[0], theirs.tokens[0])
    trainer.run()
    _check_run(tmp_path / "run", capsys.readouterr().out)


@pytest.mark.slow  # ~80 s on 2 idle cores (a fresh interpreter, every program compiled): over the suite's budget
def test_paper_shapes_cli_runs_two_steps_to_an_export(tmp_path):
    workdir = tmp_path / "run"
    args = [f"--config.{k}={v}" for k, v in SMOKE.items()]
    r = subprocess.run([sys.executable, "-m", "jaxrl_mt.train", "--config", "configs/rlsta.py:paper_shapes",
                        f"--config.workdir={workdir}", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    _check_run(workdir, r.stdout + r.stderr)

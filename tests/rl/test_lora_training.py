"""LoRA in the trainer: only adapters train, the reference is the base (no copy), resume, the adapter file."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_mt.models.registry import load_model
from jaxrl_mt.rl.data import validate_config
from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.rl.loop import Trainer
from jaxrl_mt.sampling import Sampler, SamplingConfig
from tests.rl.test_loop import run_killed_in_third_step, tiny_config, train_rows


def _config(model_dir: Path, wd: Path, steps: int = 3):
    c = tiny_config(model_dir, wd, steps=steps)
    c.lora.rank, c.lora.alpha = 4, 8.0
    c.data.heldout = 0
    c.export = True
    return c


def test_lora_trains_adapters_only_resumes_identically_and_exports_a_peft_adapter(tiny_chat_model_dir, tmp_path,
                                                                                   monkeypatch):
    full = Trainer(_config(tiny_chat_model_dir, tmp_path / "full"))
    base_before = jax.tree_util.tree_map(np.array, full.model.params)
    assert full.ref_params is full.model.params  # the reference is the base weights: no second copy
    full.run()
    crashed = tmp_path / "crashed"
    run_killed_in_third_step(monkeypatch, "update", lambda: Trainer(_config(tiny_chat_model_dir, crashed)))
    Trainer(_config(tiny_chat_model_dir, crashed)).run()
    a, b = train_rows(tmp_path / "full"), train_rows(crashed)
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for k, v in a[3].items():
        if not k.startswith("perf/") and isinstance(v, float):
            assert math.isclose(v, b[3][k], rel_tol=1e-6, abs_tol=1e-6), k
    assert a[3]["train/kl"] > 0 and "reward/anchor" in a[3]  # the policy moved off the base; anchor logged
    # the base is untouched (only adapters are optimised)
    jax.tree_util.tree_map(np.testing.assert_array_equal, base_before,
                           jax.tree_util.tree_map(np.asarray, full.model.params))
    # the PEFT adapter, merged onto the base by the model spec, is the trained policy
    adapter = tmp_path / "full" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    spec = f"{tiny_chat_model_dir}+lora:{adapter}"
    merged, exported = load_model(spec), load_model(str(tmp_path / "full" / "export"))
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), merged.params, exported.params)
    assert np.abs(np.asarray(merged.params["layers"]["q"]) - base_before["layers"]["q"]).max() > 0
    sc = SamplingConfig(max_new_tokens=8, temperature=0.0)
    prompts = [[1, 5, 9, 13], [1, 7, 7]]
    got = Sampler.from_model(merged).generate_ids(prompts, sc).tokens
    want = Sampler.from_model(exported).generate_ids(prompts, sc).tokens
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # and `workdir:` (evaluate, serve, compare) merges the checkpoint's adapters the same way
    from jaxrl_mt.rl.policy_io import load_policy

    from_ckpt = load_policy(tmp_path / "full")
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), from_ckpt.params, merged.params)


def test_bad_lora_settings_fail_at_start(tmp_path):
    for key, value, msg in [("rank", -1, r"lora\.rank must be >= 0"),
                            ("targets", "qkv", r"lora\.targets 'qkv' matches none"),
                            ("forward", "fused", r"lora\.forward must be 'unmerged' or 'merged'")]:
        c = tiny_config(tmp_path / "m", tmp_path / "w")
        c.lora.rank = 4
        setattr(c.lora, key, value)
        with pytest.raises(ConfigError, match=msg):
            validate_config(c)


@pytest.mark.slow
def test_a_trained_adapter_serves_and_evaluates_as_the_in_process_policy(tiny_chat_model_dir, tmp_path):
    """The PEFT adapter of a LoRA run, given as `BASE+lora:DIR` to `serve` and to `evaluate` (both
    subprocesses), replies greedily as the run's own policy in this process (`load_policy`, which
    merges the checkpoint's adapters), and not as the base model."""
    import json
    import os
    import signal
    import subprocess
    import sys

    import openai

    from jaxrl_mt.chat import encode_prompt
    from jaxrl_mt.evaluate import evaluate
    from jaxrl_mt.rl.policy_io import load_policy
    from tests.eval.test_evaluate_cli import tiny_config as eval_config

    c = _config(tiny_chat_model_dir, tmp_path / "run", steps=2)
    c.rl.lr = 5e-2  # a visible change of the greedy replies after two steps
    Trainer(c).run()
    spec = f"{tiny_chat_model_dir}+lora:{tmp_path / 'run' / 'adapter'}"
    policy, base = load_policy(tmp_path / "run"), load_model(str(tiny_chat_model_dir))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}

    # serve
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    proc = subprocess.Popen([sys.executable, "-m", "jaxrl_mt.serve", "--model", spec, "--served-model-name", "m",
                             "--port", "0", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving 'm' on http://127.0.0.1:"), line + proc.stderr.read()
        client = openai.OpenAI(base_url=line.split(" on ")[1].split(" ")[0], api_key="unused", max_retries=0,
                               timeout=300)
        reply = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=10)
    finally:
        proc.terminate()
        proc.wait(60)
    sc = SamplingConfig(max_new_tokens=10, temperature=0.0)
    want = Sampler.from_model(policy).generate_ids([encode_prompt(policy.tokenizer, messages)], sc).texts[0]
    from_base = Sampler.from_model(base).generate_ids([encode_prompt(base.tokenizer, messages)], sc).texts[0]
    assert reply.choices[0].message.content == want != from_base

    # evaluate: the CLI on the spec against the in-process evaluation of the run's policy
    def replies(workdir: Path) -> list[str]:
        recs = [json.loads(x) for x in (workdir / "transcripts.jsonl").read_text().splitlines() if x.strip()]
        return [t["assistant"] for r in sorted(recs, key=lambda r: r["conv_id"]) for t in r["turns"]]

    args = dict(dataset=("synthetic:1",), runs=1, temperature=0.0, max_new_tokens=6, scenarios=("full", "sharded"))
    evaluate(eval_config(tmp_path / "ev_policy", **args), model=policy, log=lambda s: None)
    evaluate(eval_config(tmp_path / "ev_base", **args), model=base, log=lambda s: None)
    cli = [sys.executable, "-m", "jaxrl_mt.evaluate", "--config", f"{root / 'configs' / 'eval_lic.py'}:cpu",
           f"--config.model={spec}", "--config.dataset=synthetic:1", "--config.runs=1", "--config.temperature=0",
           "--config.max_new_tokens=6", "--config.scenarios=full,sharded", f"--config.workdir={tmp_path / 'ev_cli'}",
           f"--config.system_prompt={eval_config(tmp_path).system_prompt}", "--config.bootstrap=50",
           "--config.plots=False"]
    r = subprocess.run(cli, capture_output=True, text=True, cwd=root, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = replies(tmp_path / "ev_cli")
    assert got and got == replies(tmp_path / "ev_policy") != replies(tmp_path / "ev_base")
    assert proc.returncode in (0, -signal.SIGTERM)


@pytest.mark.slow
def test_a_lora_run_killed_with_sigkill_resumes_with_identical_metrics(tiny_chat_model_dir, tmp_path):
    """A real kill -9 of the training process after its second checkpoint, then a resume: the
    metrics of every step equal those of an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    script = ("import sys; from pathlib import Path; from tests.rl.test_lora_training import _config; "
              "from jaxrl_mt.rl.loop import Trainer; Trainer(_config(Path(sys.argv[1]), Path(sys.argv[2]), 4)).run()")
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}

    def train(wd: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", script, str(tiny_chat_model_dir), str(wd)], cwd=root, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    assert train(tmp_path / "full").wait(600) == 0
    proc = train(tmp_path / "killed")
    deadline = time.monotonic() + 600
    while not (tmp_path / "killed" / "checkpoints" / "2").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    assert not (tmp_path / "killed" / "adapter").exists()  # it died before the end
    assert train(tmp_path / "killed").wait(600) == 0
    a, b = train_rows(tmp_path / "full"), train_rows(tmp_path / "killed")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        for k, v in a[step].items():
            if not k.startswith("perf/") and isinstance(v, float):
                assert math.isclose(v, b[step][k], rel_tol=1e-6, abs_tol=1e-6), (step, k)
    assert (tmp_path / "killed" / "adapter" / "adapter_model.safetensors").is_file()

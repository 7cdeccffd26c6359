"""`python -m jaxrl_mt.serve`: the command itself (start-up errors; a training run's policy served)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}


def serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "jaxrl_mt.serve", *args]


@pytest.mark.parametrize("args,needle", [
    (("--model", "/no/such/model", "--port", "0"), "error: --model '/no/such/model': ModelError: unknown model"),
    (("--model", "workdir:/no/such/run", "--port", "0"),
     "error: --model 'workdir:/no/such/run': FileNotFoundError: /no/such/run: not a training workdir"),
    (("--model", "x", "--max-batch", "0"), "error: bad value --max-batch=0"),
    (("--model", "x", "--read-timeout", "0"), "error: bad value --read-timeout=0.0 / --slice-tokens=16"),
    (("--model", "x", "--max-body-bytes", "0"), "error: bad value --max-body-bytes=0"),
])
def test_startup_errors_are_one_line_and_exit_2(args, needle):
    proc = subprocess.run(serve_cmd(*args), capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    assert proc.returncode == 2
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [proc.stderr.strip()]
    assert proc.stderr.startswith(needle), proc.stderr


@pytest.mark.slow
def test_serves_a_training_runs_policy(tiny_chat_model_dir, tmp_path):
    """A 1-step training run, served as workdir:PATH; the reply equals the policy's own greedy reply."""
    import openai

    from jaxrl_mt.chat import encode_prompt
    from jaxrl_mt.rl.loop import Trainer, load_policy
    from jaxrl_mt.sampling import Sampler, SamplingConfig
    from tests.rl.test_loop import tiny_config

    workdir = tmp_path / "run"
    Trainer(tiny_config(tiny_chat_model_dir, workdir, steps=1)).run()
    proc = subprocess.Popen(serve_cmd("--model", f"workdir:{workdir}", "--served-model-name", "rlsta", "--port", "0",
                                      "--log-level", "warning"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving 'rlsta' on http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split(" on ")[1].split(" ")[0]
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "What is 3 + 4?"}]
        reply = client.chat.completions.create(model="rlsta", messages=messages, temperature=0, max_tokens=10)
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn shuts down, then re-raises the signal
    policy = load_policy(workdir)
    want = Sampler.from_model(policy).generate_ids([encode_prompt(policy.tokenizer, messages)],
                                                   SamplingConfig(max_new_tokens=10, temperature=0.0))
    assert reply.choices[0].message.content == want.texts[0]

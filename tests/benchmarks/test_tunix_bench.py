"""`python -m jaxrl_mt.benchmarks tunix`: arguments, the missing-venv error, the per-row divergence
and median arithmetic, the id tokenizer tunix's sampler is fed with, the GRPO jobs' LoRA rank, the
adapters' parameter count and the check of what tunix trained, and (slow, only where tunix's venv
exists) both sides agreeing on greedy tokens and on logits within 1e-4, and a LoRA GRPO round of
both sides on a tiny random model where tunix's optimizer trains exactly the adapters.

CI builds tunix's venv (`.ci/run`: a cold install took 64 s) and runs the smoke test of the whole command
on a tiny model; without the venv (the README's test command alone) the tests that need it skip.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxrl_mt.benchmarks import __main__ as bench_main
from jaxrl_mt.benchmarks.tunix import (ENV_SCRIPT, ROOT, SIDE_SCRIPT, TunixMissing, first_divergence, make_job,
                                       parse_args, side_rates, tunix_python)

VENV = ROOT / ".venv-tunix"


def _side_module():
    spec = importlib.util.spec_from_file_location("tunix_side_under_test", SIDE_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports no tunix at module level
    return mod


def test_defaults_are_the_bench_shape():
    a = parse_args([])
    assert (a.steps, a.batch, a.new_tokens, a.prompt_len, a.repeats) == (3, 8, 128, 64, 1)
    assert a.venv == ".venv-tunix" and a.json is None and a.side is None and not a.grpo and a.grpo_steps == 3
    assert a.lora_rank == 0
    a = parse_args(["--steps", "5", "--json", "o.json", "--venv", "/x"])
    assert (a.steps, a.json, a.venv) == (5, "o.json", "/x")


@pytest.mark.parametrize("flag", ["--steps", "--batch", "--new-tokens", "--prompt-len", "--repeats", "--grpo-steps"])
def test_nonpositive_counts_are_refused(flag, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args([flag, "0"])
    assert e.value.code == 2
    assert f"{flag} must be > 0, got 0" in capsys.readouterr().err


def test_lora_rank_is_parsed_with_grpo():
    a = parse_args(["--grpo", "--lora-rank", "16"])
    assert a.grpo and a.lora_rank == 16


@pytest.mark.parametrize("argv, message", [(["--grpo", "--lora-rank", "-1"], "--lora-rank must be >= 0, got -1"),
                                           (["--lora-rank", "16"], "--lora-rank applies to the GRPO step")])
def test_bad_lora_rank_fails_at_start(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # the CLI: before looking for the venv or loading anything
        bench_main.main(["tunix", "--venv", str(tmp_path / "nope"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_missing_venv_is_one_line_naming_the_script(tmp_path, capsys):
    with pytest.raises(TunixMissing, match="tunix_env.sh"):
        tunix_python(tmp_path / "nope")
    assert bench_main.main(["tunix", "--venv", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: tunix venv not found") and ENV_SCRIPT in err


def test_first_divergence_per_row():
    ours = [[1, 2, 3], [1, 2, 3], [4, 5], [7]]
    theirs = [[1, 2, 3], [1, 9, 3], [4, 5, 6], [8]]
    assert first_divergence(ours, theirs) == [None, 1, 2, 0]


def test_side_rates_medians_and_decode_loop():
    runs = [{"full": {"steady_s": s, "first_s": 10.0}, "one": {"steady_s": o}} for s, o in
            ((2.0, 0.5), (4.0, 0.1), (3.0, 0.3))]
    r = side_rates(runs, batch=8, n=128)
    assert r["steady_s"] == 3.0 and r["prefill_s"] == 0.3
    assert r["tokens_per_s"] == pytest.approx(8 * 128 / 3.0)
    assert r["decode_s"] == pytest.approx(2.7)
    assert r["decode_tokens_per_s"] == pytest.approx(8 * 127 / 2.7)
    assert r["rounds_steady_s"] == [2.0, 4.0, 3.0]


def test_id_tokenizer_round_trip_and_no_bos():
    tok = _side_module().IdsTokenizer(pad_id=2)
    assert tok.encode("5 17 300") == [5, 17, 300]
    assert tok.decode([5, 17, 300]) == "5 17 300"
    assert tok.bos_id() is None and tok.pad_id() == 2 and tok.eos_id() == 2


def test_grpo_job_gives_tunix_a_pad_no_prompt_holds():
    from jaxrl_mt.benchmarks.tunix_grpo import grpo_spec, tunix_grpo_job

    spec = grpo_spec("builtin:smollm2-135m-instruct", prompts=4, group=4, new_tokens=128, beta=1e-4, steps=3)
    job = tunix_grpo_job(spec)
    assert 2 in {t for p in job["prompts"] for t in p}  # SmolLM2's pad (<|im_end|>) is in chat prompts
    assert job["pad_id"] not in {t for p in job["prompts"] for t in p}
    w = job["prompt_len"]
    assert w & (w - 1) == 0 and w >= max(map(len, job["prompts"])) > w // 2
    assert (len(job["prompts"]), job["group"], job["new_tokens"], job["beta"]) == (4, 4, 128, 1e-4)
    assert (job["remat"], job["micro_batch"]) == ("none", 1)
    assert spec["lora_rank"] == job["lora_rank"] == 0


def test_grpo_spec_and_job_carry_the_lora_rank():
    from jaxrl_mt.benchmarks.tunix_grpo import grpo_spec, tunix_grpo_job

    spec = grpo_spec("builtin:smollm2-135m-instruct", prompts=4, group=4, new_tokens=128, beta=1e-4, steps=3,
                     lora_rank=16)
    assert (spec["lora_rank"], spec["lora_forward"]) == (16, "unmerged")  # our worker: alpha 2 x rank
    assert tunix_grpo_job(spec)["lora_rank"] == 16
    with pytest.raises(ValueError, match="lora_rank must be >= 0"):
        grpo_spec("builtin:smollm2-135m-instruct", prompts=4, group=4, new_tokens=8, beta=0.0, steps=2, lora_rank=-2)


def test_adapter_params_by_hand(tmp_path):
    from jaxrl_mt.benchmarks.tunix_grpo import adapter_params
    from jaxrl_mt.models.registry import resolve

    # SmolLM2-135M: d 576, 9 heads x 64, 3 kv heads, ffn 1536, 30 layers; rank 16 = the 4.9 M of issue 34
    per_layer = (576 + 576) + 2 * (576 + 192) + (576 + 576) + 2 * (576 + 1536) + (1536 + 576)
    assert adapter_params(resolve("builtin:smollm2-135m-instruct"), 16) == 30 * 16 * per_layer == 4_884_480
    cfg = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert adapter_params(tmp_path, 4) == 2 * 4 * (64 + 48 + 48 + 64 + 96 + 96 + 96) == 4096


def test_check_lora_refuses_other_training():
    from jaxrl_mt.benchmarks.tunix_grpo import check_lora

    ours = {"lora_rank": 4}
    good = {"lora_rank": 4, "trainable_params": 4096, "params": 10_000, "base_unchanged": True}
    check_lora(4, 4096, ours, good)
    with pytest.raises(RuntimeError, match="expected 4096"):
        check_lora(4, 4096, ours, {**good, "trainable_params": 10_000})
    with pytest.raises(RuntimeError, match="changed the base weights"):
        check_lora(4, 4096, ours, {**good, "base_unchanged": False})
    with pytest.raises(RuntimeError, match="the sides ran"):
        check_lora(4, 4096, {"lora_rank": 0}, good)
    full = {"lora_rank": 0, "trainable_params": 10_000, "params": 10_000, "base_unchanged": False}
    check_lora(0, None, {"lora_rank": 0}, full)
    with pytest.raises(RuntimeError, match="expected 10000 \\(all\\)"):
        check_lora(0, None, {"lora_rank": 0}, {**full, "trainable_params": 4096})


def test_grpo_report_lines():
    from jaxrl_mt.benchmarks.tunix_grpo import format_grpo

    r = {"prompts": 4, "group": 4, "new_tokens": 128, "beta": 1e-4, "rounds": 3, "steps": 3,
         "ours": {"steady_step_s": 20.0, "peak_rss_mb": 3000.0,
                  "phases_steady_s": {"generate_s": 12.0, "score_s": 3.0, "update_s": 5.0}},
         "tunix": {"steady_step_s": 30.0, "peak_rss_mb": 6000.0}, "ratio_step": 1.5, "ratio_rss": 0.5}
    text = format_grpo(r)
    assert "ours   20.0 s per step (generate 12.0, score 3.0, update 5.0), peak RSS 3000 MB" in text
    assert "ours 1.50x faster per step, at 0.50x tunix's peak RSS" in text
    assert "full fine-tuning" in text and "[full]" in text
    lora = {**r, "lora_rank": 16, "adapter_params": 4_884_480, "ours": {**r["ours"], "lora_rank": 16},
            "tunix": {**r["tunix"], "lora_rank": 16, "trainable_params": 4_884_480, "params": 139_399_104,
                      "base_unchanged": True}}
    text = format_grpo(lora)
    assert "LoRA rank 16, alpha 32, q/k/v/o/gate/up/down (4,884,480 adapter parameters)" in text
    assert "peak RSS 3000 MB [LoRA rank 16]" in text
    assert ("[LoRA rank 16; its optimizer trains 4,884,480 of 139,399,104 parameters, base weights unchanged]"
            in text)


def test_job_prompts_avoid_pad_and_eos():
    job, cfg = make_job("builtin:smollm2-135m-instruct", batch=8, new_tokens=4, prompt_len=64, repeats=1)
    banned = {job["pad_id"], *cfg.eos_token_id}
    assert len(job["prompts"]) == 8 and max(map(len, job["prompts"])) == 64
    assert not banned & {t for p in job["prompts"] for t in p}
    assert Path(job["hf_dir"], "config.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason="no tunix venv (jaxrl_mt/benchmarks/tunix_env.sh)")
def test_both_sides_agree_on_greedy_tokens_and_logits(tmp_path):
    job, _ = make_job("builtin:smollm2-135m-instruct", batch=2, new_tokens=6, prompt_len=16, repeats=1)
    (tmp_path / "job.json").write_text(json.dumps(job))
    outs = {}
    for side, cmd in (("ours", [sys.executable, "-m", "jaxrl_mt.benchmarks.tunix", "--side", "ours"]),
                      ("tunix", [str(VENV / "bin" / "python"), str(SIDE_SCRIPT)])):
        out = tmp_path / f"{side}.json"
        subprocess.run([*cmd, "--job", str(tmp_path / "job.json"), "--out", str(out)], cwd=ROOT, check=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        outs[side] = (json.loads(out.read_text()), np.load(str(out) + ".logits.npy"))
    (ours, lo), (theirs, lt) = outs["ours"], outs["tunix"]
    assert [len(t) for t in theirs["tokens"]] == [6, 6]
    assert ours["tokens"] == theirs["tokens"]
    assert np.max(np.abs(lo - lt)) < 1e-4


@pytest.mark.slow
@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason="no tunix venv (jaxrl_mt/benchmarks/tunix_env.sh)")
def test_lora_grpo_round_trains_exactly_the_adapters_on_both_sides(tiny_chat_model_dir):
    from jaxrl_mt.benchmarks.tunix import run_side
    from jaxrl_mt.benchmarks.tunix_grpo import format_grpo, run_grpo

    r = run_grpo(VENV / "bin" / "python", run_side, model=str(tiny_chat_model_dir), rounds=1, steps=2, new_tokens=4,
                 prompts=2, group=2, lora_rank=4)
    # the tiny model: 2 layers, d 32, 4 heads x 8, 2 kv heads x 8, ffn 64; A [in, 4] + B [4, out] per projection
    by_hand = 2 * 4 * ((32 + 32) + (32 + 16) + (32 + 16) + (32 + 32) + (32 + 64) + (32 + 64) + (64 + 32))
    assert r["adapter_params"] == r["tunix"]["trainable_params"] == by_hand == 4096
    assert r["tunix"]["base_unchanged"] and r["tunix"]["params"] > 300 * by_hand  # + the frozen base
    assert r["lora_rank"] == r["ours"]["lora_rank"] == r["tunix"]["lora_rank"] == 4
    assert r["ours"]["steady_step_s"] > 0 and r["tunix"]["steady_step_s"] > 0
    assert "LoRA rank 4, alpha 8" in format_grpo(r)


@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason="no tunix venv (jaxrl_mt/benchmarks/tunix_env.sh)")
def test_smoke_whole_command_on_a_tiny_model(tiny_chat_model_dir, tmp_path):
    """CI's form of the benchmark (.ci/run builds tunix's venv): the whole command on a tiny random model,
    one round, a full-fine-tuning GRPO round of 2 steps per side; the JSON's fields are there and agree."""
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, "-m", "jaxrl_mt.benchmarks", "tunix", "--model", str(tiny_chat_model_dir),
                    "--steps", "1", "--batch", "2", "--new-tokens", "4", "--prompt-len", "8", "--grpo",
                    "--grpo-steps", "2", "--json", str(out)], cwd=ROOT, check=True)
    r = json.loads(out.read_text())
    assert (r["batch"], r["new_tokens"], r["steps"]) == (2, 4, 1)
    for side in ("ours", "tunix"):
        assert r[side]["tokens_per_s"] > 0 and r[side]["decode_tokens_per_s"] > 0 and r[side]["lengths"] == [4, 4]
        assert r["grpo"][side]["steady_step_s"] > 0 and r["grpo"][side]["peak_rss_mb"] > 0
    assert r["agree_rows"] == 2 and r["first_divergence"] == [None, None] and r["max_abs_logit_diff"] < 1e-4
    assert r["ratio_tokens_per_s"] == pytest.approx(r["ours"]["tokens_per_s"] / r["tunix"]["tokens_per_s"])
    g = r["grpo"]
    assert g["tunix"]["trainable_params"] == g["tunix"]["params"] and not g["tunix"]["base_unchanged"]  # full FT
    assert g["ratio_step"] == pytest.approx(g["tunix"]["steady_step_s"] / g["ours"]["steady_step_s"])

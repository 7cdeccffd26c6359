"""`python -m jaxrl_mt.evaluate`: end to end on a tiny model, resume, bad input, the CLI itself.

The slow test runs every scenario with the embedded model on the shipped LiC sample and
synthetic data and recomputes P / A90 / U90-10 from the transcripts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from jaxrl_mt.data.records import DataError
from jaxrl_mt.eval.simulator import LIC_SCENARIOS, EvalError, run_score
from jaxrl_mt.evaluate import evaluate, load_eval_model, normalize_config
from jaxrl_mt.rewards.judge import classify_rule_based
from jaxrl_mt.rewards.verifier import extract_answer, verify
from tests.eval.test_simulator import SYSTEM, counting_sampler
from tests.eval.test_user_sim import server  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "eval_lic.py"


def get_config(preset: str = "cpu", **overrides):
    spec = importlib.util.spec_from_file_location("eval_lic_config", CONFIG)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.get_config(preset)
    cfg.lock()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def tiny_config(workdir, **kw):
    base = dict(dataset=("synthetic:1", "lic:@"), limit=1, runs=2, max_new_tokens=4, system_prompt=SYSTEM,
                workdir=str(workdir), bootstrap=50, plots=False)
    return get_config("cpu", **{**base, **kw})


def read_transcripts(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def recompute(records) -> dict[str, tuple[float, float, float]]:
    """P, A90, U90-10 per scenario straight from transcript scores (numpy, linear percentiles)."""
    by: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by[r["kind"]][r["task_id"]].append(100.0 * r["score"])
    out = {}
    for kind, tasks in by.items():
        per = [(np.mean(s), np.percentile(s, 90), np.percentile(s, 90) - np.percentile(s, 10)) for s in tasks.values()]
        out[kind] = tuple(np.mean(per, axis=0))
    return out


def check_transcripts(records, protocol: str, mode: str = "strict") -> None:
    """Every line well formed and self-consistent: verdicts and score recomputed from the text."""
    for r in records:
        assert r["conv_id"] == f"{r['task_id']}|{r['kind']}|{r['run']}"
        assert r["n_turns"] == len(r["turns"]) and 1 <= r["n_turns"] <= r["n_planned_turns"]
        for k, t in enumerate(r["turns"]):
            assert t["index"] == k and t["user"] and isinstance(t["assistant"], str)
            assert t["label"] == classify_rule_based(t["assistant"])
            assert t["answer_attempt"] == (t["label"] == "answer_attempt")
            assert t["extracted"] == extract_answer(t["assistant"])
            assert t["correct"] == verify(t["assistant"], r["gold"], mode)
        assert (r["score"], r["scored_turn"]) == run_score(r["turns"], protocol)
        if protocol == "lic" and r["stop_reason"] == "correct_answer":
            assert r["turns"][-1]["answer_attempt"] and r["turns"][-1]["correct"] == 1.0
        else:
            assert r["n_turns"] == r["n_planned_turns"]


def assert_report_matches(report, records):
    want = recompute(records)
    assert set(report["scenarios"]) == set(want)
    for kind, (p, a90, u) in want.items():
        s = report["scenarios"][kind]
        assert (s["P"], s["A90"], s["U90_10"]) == pytest.approx((p, a90, u), abs=1e-9)
    assert report["n_conversations"] == len(records)


# --------------------------------------------------------------------------- tiny model, in process


def test_every_scenario_runs_and_report_matches_transcripts(tmp_path, tiny_model):
    logs = []
    out = evaluate(tiny_config(tmp_path), model=tiny_model, sampler=counting_sampler(tiny_model, max_batch=8),
                   log=logs.append)
    n = 2 * 8 * 2  # instructions x scenarios x runs
    assert (out["n_planned"], out["n_generated"], out["n_resumed"]) == (n, n, 0)
    assert f"turn 1: {n} active conversations" in "\n".join(logs)  # every scenario in one batch
    recs = read_transcripts(tmp_path / "transcripts.jsonl")
    assert len(recs) == n and len({r["conv_id"] for r in recs}) == n
    assert {r["task_id"] for r in recs} == {"synthetic/0/0", "sharded-GSM8K/1246"}
    check_transcripts(recs, "lic")
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["scenarios"]) == list(LIC_SCENARIOS)
    assert_report_matches(report, recs)
    assert report["config"]["runs"] == 2 and report["this_invocation"]["n_generated"] == n
    assert (tmp_path / "report.md").read_text().count("\n| ") == 8 + 1  # header + one row per scenario

    # The report is built from the transcripts: edit scores there, rerun, nothing is generated.
    for r in recs:
        r["score"] = float(r["run"] == 0 or r["kind"] == "full")
    (tmp_path / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    again = evaluate(tiny_config(tmp_path), model=tiny_model, sampler=None, log=lambda s: None)
    assert again["n_generated"] == 0
    assert_report_matches(again["report"], recs)
    full, sharded = again["report"]["scenarios"]["full"], again["report"]["scenarios"]["sharded"]
    assert (full["P"], full["A90"], full["U90_10"]) == (100.0, 100.0, 0.0)
    # Each instruction's runs score [1, 0]: P 50, A90 = 0 + 0.9 * 100, U = 90 - 10.
    assert (sharded["P"], sharded["A90"], sharded["U90_10"]) == pytest.approx((50.0, 90.0, 80.0))
    assert sharded["ratio_to_full"] == 0.5


def test_resume_regenerates_only_missing_conversations(tmp_path, tiny_model):
    cfg = tiny_config(tmp_path, dataset=("synthetic:2",), limit=0, scenarios=("full", "sharded", "snowball"),
                      protocol="final_turn")
    first = evaluate(cfg, model=tiny_model, sampler=counting_sampler(tiny_model), log=lambda s: None)
    n = 2 * 3 * 2
    assert first["n_generated"] == n
    path = tmp_path / "transcripts.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    uninterrupted = {r["conv_id"]: r for r in read_transcripts(path)}
    kept = lines[: n // 2]
    path.write_text("".join(kept) + lines[n // 2][:40])  # half, plus a line cut by an interruption
    (tmp_path / "report.json").unlink()
    sampler, logs = counting_sampler(tiny_model), []
    second = evaluate(cfg, model=tiny_model, sampler=sampler, log=logs.append)
    assert (second["n_generated"], second["n_resumed"]) == (n - n // 2, n // 2)
    assert f"turn 1: {n - n // 2} active conversations" in "\n".join(logs)  # only the missing ones
    assert sum(sampler.sizes[:2]) == n - n // 2  # first turn: chunks of 4 + 2 rows
    recs = read_transcripts(path)
    assert len(recs) == n and len({r["conv_id"] for r in recs}) == n
    assert [json.dumps(r) for r in recs[: n // 2]] == [json.dumps(json.loads(x)) for x in kept]
    # per-conversation sampling keys (temperature 1): the redone conversations, answered in a
    # smaller batch with other neighbours, are those of the uninterrupted run
    assert [r for r in recs[n // 2:]] == [uninterrupted[r["conv_id"]] for r in recs[n // 2:]]
    check_transcripts(recs, "final_turn")
    assert_report_matches(json.loads((tmp_path / "report.json").read_text()), recs)
    # Adding runs later only simulates the new ones.
    cfg.runs = 3
    third = evaluate(cfg, model=tiny_model, sampler=counting_sampler(tiny_model), log=lambda s: None)
    assert (third["n_generated"], third["n_resumed"]) == (2 * 3, n)
    # A resume under a different results-defining field is refused.
    cfg.temperature = 0.5
    with pytest.raises(EvalError, match=r"eval_config\.json: field 'temperature': .* 1\.0, this run has 0\.5"):
        evaluate(cfg, model=tiny_model, sampler=counting_sampler(tiny_model), log=lambda s: None)


def test_http_judge_from_config(tmp_path, tiny_model, server):  # noqa: F811
    server.respond = lambda payload: (200, "Category: refusal")
    cfg = tiny_config(tmp_path, dataset=("synthetic:1",), scenarios=("sharded",), judge=f"http:{server.url}#j")
    out = evaluate(cfg, model=tiny_model, sampler=counting_sampler(tiny_model), log=lambda s: None)
    recs = read_transcripts(tmp_path / "transcripts.jsonl")
    assert all(t["label"] == "refusal" for r in recs for t in r["turns"])
    assert len(server.requests) == 2 * 4  # one request per reply, 2 runs x 4 turns
    assert out["report"]["scenarios"]["sharded"]["response_types"]["1"] == {"refusal": 2}
    assert out["report"]["this_invocation"]["judge"] == {"llm": 8, "fallback": 0, "empty": 0}


# --------------------------------------------------------------------------- bad input


def test_bad_config_values(tmp_path):
    with pytest.raises(EvalError, match=r"config field 'scenarios': unknown scenario kind 'shardded'"):
        normalize_config(tiny_config(tmp_path, scenarios=("full", "shardded")))
    with pytest.raises(EvalError, match=r"config field 'task': unknown task 'maths'; valid: code"):
        normalize_config(tiny_config(tmp_path, task="maths"))
    with pytest.raises(EvalError, match=r"config field 'task': 'summary' has no offline verifier"):
        normalize_config(tiny_config(tmp_path, task="summary"))
    with pytest.raises(EvalError, match=r"config field 'protocol': unknown 'best'"):
        normalize_config(tiny_config(tmp_path, protocol="best"))
    with pytest.raises(EvalError, match=r"config field 'judge': unknown 'gpt4'"):
        normalize_config(tiny_config(tmp_path, judge="gpt4"))
    with pytest.raises(EvalError, match=r"config field 'strategy': unknown strategy 'sedt2'; known: plain, sedt"):
        normalize_config(tiny_config(tmp_path, strategy="sedt2"))
    with pytest.raises(EvalError, match=r"config field 'runs': bad value 0"):
        normalize_config(tiny_config(tmp_path, runs=0))
    with pytest.raises(AttributeError, match="runz"):  # the config is locked: a misspelt key fails
        tiny_config(tmp_path, runz=3)
    assert normalize_config(tiny_config(tmp_path, scenarios=("full,mt_add",))).scenarios == ("full", "sharded")


def test_bad_data_is_named(tmp_path):
    lic = [{"task_id": "t1", "task": "math", "shards": [{"shard_id": 1, "shard": "How many?"},
                                                         {"shard_id": 2, "shard": "She has 3 apples."}],
            "question": "She has 3 apples. How many?", "answer": "#### 3"},
           {"task_id": "t2", "task": "math", "shards": [{"shard_id": 1, "shard": "How many?"}],
            "question": "How many?"}]
    f = tmp_path / "lic.json"
    f.write_text(json.dumps(lic, indent=1))
    with pytest.raises(DataError, match=rf"{f}:\d+: field 'answer': missing"):
        evaluate(tiny_config(tmp_path / "w", dataset=(f"lic:{f}",)), log=lambda s: None)
    rows = [{"task_id": "x1", "domain": "math", "target": "How many?", "conditions": ["She has 3."],
             "full_prompt": "She has 3. How many?", "answer": "three"}]
    g = tmp_path / "tasks.jsonl"
    g.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(EvalError, match=r"task 'x1': field 'answer': 'three' holds no number"):
        evaluate(tiny_config(tmp_path / "w", dataset=(f"tasks:{g}",)), log=lambda s: None)
    with pytest.raises(DataError, match=r"unknown source 'csv:x'"):
        evaluate(tiny_config(tmp_path / "w", dataset=("csv:x",)), log=lambda s: None)
    with pytest.raises(EvalError, match=r"duplicate task id 'synthetic/0/0'"):
        evaluate(tiny_config(tmp_path / "w", dataset=("synthetic:1", "synthetic:1")), log=lambda s: None)


def test_workdir_model_spec_uses_the_checkpoint_loader(monkeypatch):
    """`workdir:PATH` goes to jaxrl_mt.rl.policy_io.load_policy with the configured attention."""
    import types

    seen, policy = [], object()
    fake = types.ModuleType("jaxrl_mt.rl.policy_io")
    fake.load_policy = lambda path, attention: seen.append((path, attention)) or policy
    monkeypatch.setitem(sys.modules, "jaxrl_mt.rl.policy_io", fake)
    assert load_eval_model("workdir:/runs/rlsta", attention="blockwise") is policy
    assert seen == [("/runs/rlsta", "blockwise")]


def test_evaluate_loads_a_checkpoint_without_importing_the_trainer(tmp_path):
    """Importing jaxrl_mt.evaluate, and loading a `workdir:` model through it, leaves jaxrl_mt.rl.loop
    (the trainer) unimported (issue 52 item 5)."""
    code = ("import sys, jaxrl_mt.evaluate as e\n"
            "try:\n    e.load_eval_model(sys.argv[1])\nexcept FileNotFoundError as err:\n    print(err)\n"
            "print(sorted(m for m in sys.modules if m in ('jaxrl_mt.rl.loop', 'jaxrl_mt.rl.policy_io')))\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", code, f"workdir:{tmp_path}"], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [f"{tmp_path}: not a training workdir (no config.json)",
                                     "['jaxrl_mt.rl.policy_io']"]


# --------------------------------------------------------------------------- the command line


def _cli(*args, timeout=300):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "jaxrl_mt.evaluate", "--config", f"{CONFIG}:cpu", *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


def test_cli_rejects_unknown_key_and_bad_scenario(tmp_path):
    r = _cli("--config.runz=4", f"--config.workdir={tmp_path}")
    assert r.returncode != 0 and "runz" in r.stderr
    r = _cli("--config.scenarios=full,shardded", f"--config.workdir={tmp_path}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: config field 'scenarios': unknown scenario kind "
                                                        "'shardded'")
    assert not (tmp_path / "transcripts.jsonl").exists()


@pytest.mark.slow
def test_cli_end_to_end_on_tiny_model(tmp_path, tiny_model):
    r = _cli(f"--config.model={tiny_model.path}", "--config.dataset=synthetic:1", "--config.runs=3",
             "--config.scenarios=full,sharded", "--config.max_new_tokens=3", f"--config.workdir={tmp_path}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| sharded | 1 | 3 |" in r.stdout
    recs = read_transcripts(tmp_path / "transcripts.jsonl")
    assert len(recs) == 2 * 3
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["config"]["runs"] == 3
    assert_report_matches(report, recs)
    assert {p.name for p in tmp_path.glob("*.png")} == {"p_by_scenario.png", "aptitude_unreliability.png",
                                                       "first_answer_turn.png"}


# --------------------------------------------------------------------------- the embedded model


@pytest.mark.slow
def test_embedded_model_every_scenario_lic_sample_and_synthetic(tmp_path, embedded_model):
    cfg = get_config("cpu", dataset=("lic:@", "synthetic:2"), limit=2, runs=2, max_new_tokens=24,
                     workdir=str(tmp_path), bootstrap=100)
    out = evaluate(cfg, model=embedded_model, log=lambda s: None)
    n = 4 * 8 * 2
    assert out["n_generated"] == n
    recs = read_transcripts(tmp_path / "transcripts.jsonl")
    assert len(recs) == n and {r["kind"] for r in recs} == set(LIC_SCENARIOS)
    assert {r["task_id"].split("/")[0] for r in recs} == {"sharded-GSM8K", "synthetic"}
    check_transcripts(recs, "lic")
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["scenarios"]) == list(LIC_SCENARIOS)
    assert_report_matches(report, recs)
    assert all(len(t["assistant"]) > 0 for r in recs for t in r["turns"])

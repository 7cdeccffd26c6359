"""The whole experiment pipeline at CI size: held-out set -> 2 training steps each of RLSTA and GRPO
(the `experiment` presets on the tiny chat model) -> compare on 10 problems -> report, checked
against a recomputation from the files the command wrote."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from configs.grpo import get_config as grpo_config
from configs.rlsta import get_config as rlsta_config
from experiments import compare, heldout
from experiments.analysis import restates_user
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.sampling.kernels import ENGINE_VERSION
from jaxrl_mt.rl.loop import Trainer

KINDS = ("full", "sharded", "mt_refine")


def _train(get_config, model_dir: Path, workdir: Path, held: Path) -> None:
    c = get_config("experiment")
    c.model, c.workdir = str(model_dir), str(workdir)
    c.data.add_source = c.data.refine_source = "family:train:4:1"
    c.filter.enabled = False  # a random-weight model solves nothing, so the filter would keep nothing
    c.history.max_new_tokens = 4
    c.rl.steps, c.rl.batch_size, c.rl.group_size, c.rl.max_new_tokens = 2, 2, 2, 6
    c.rl.remat, c.rl.max_batch = False, 16
    c.eval.max_new_tokens = 6
    c.eval.probe_source, c.eval.probe_limit, c.eval.probe_every = f"tasks:{held}", 2, 0  # before and after
    c.checkpoint.every = 2
    Trainer(c).run()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, tiny_chat_model_dir: Path) -> dict:
    root = tmp_path_factory.mktemp("smoke")
    held = root / "heldout.jsonl"
    assert heldout.main(["--out", str(held), "--seed", "0", "--one-step", "8", "--two-step", "4"]) == 0
    _train(rlsta_config, tiny_chat_model_dir, root / "rlsta_exp", held)
    _train(grpo_config, tiny_chat_model_dir, root / "grpo_exp", held)
    md = root / "docs" / "rlsta_cpu.md"
    args = ["--models", f"base,{root / 'rlsta_exp'},{root / 'grpo_exp'}", "--base", str(tiny_chat_model_dir),
            "--heldout", str(held), "--out", str(md), "--limit", "10", "--lic-runs", "2", "--lic-every", "5",
            "--max-new-tokens", "6", "--bootstrap", "50"]
    assert compare.main(args) == 0
    out = md.with_suffix("")
    return {"md": md, "out": out, "report": json.loads((out / "report.json").read_text()), "args": args}


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_report_structure(smoke: dict) -> None:
    rep, out, md = smoke["report"], smoke["out"], smoke["md"].read_text()
    assert list(rep["models"]) == ["base", "rlsta_exp", "grpo_exp"]
    assert set(rep["pairs"]) == {"rlsta_exp - base", "grpo_exp - base", "grpo_exp - rlsta_exp"}
    for m in rep["models"].values():
        assert set(m["strict"]) == {*KINDS, "multi", "avg", "ratio"} and m["strict"]["full"]["n"] == 10
        assert set(m["lic"]) == {"full", "sharded"} and m["lic"]["full"]["n_instructions"] == 2
        assert m["lic"]["full"]["n_runs"] == 4  # 2 problems x N = 2
        assert set(m["inertia"]) == {"all", "sharded", "mt_refine"} and m["response_types"]["sharded"]
    for run in ("rlsta_exp", "grpo_exp"):
        curves = rep["runs"][run]["curves"]
        assert [p[0] for p in curves["reward/total"]] == [1, 2]
        assert [p[0] for p in curves["probe/multi_turn_strict"]] == [0, 2]
        assert "answer/distinct_numbers_final_line" in curves
        assert rep["runs"][run]["config"]["alpha"] == (1.0 if run == "rlsta_exp" else 0.0)
    assert "seeds" not in rep  # no <arm>_s<N> models
    for png in ("accuracy.png", "lic_score_inertia.png", "response_types.png", "curves.png", "training_dynamics.png"):
        assert (out / png).stat().st_size > 1000, png
        assert f"rlsta_cpu/{png}" in md
    for head in ("## Held-out accuracy", "## Paired differences", "## LiC metrics", "## Contextual inertia",
                 "## Training runs", "## Training dynamics", "acc. uncut", "pass@2 / pass^2"):
        assert head in md
    here = rep["manifest"]["code"]  # the invocation's code version (a commit made meanwhile must not matter)
    assert here and len(here["commit"]) == 40
    for name in rep["models"]:  # each evaluation ran once, from nothing, on the invocation's code
        runs = {"greedy": 30, "lic": 8}  # conversations generated: 10 problems x 3 scenarios; 2 x 2 scenarios x N 2
        assert {sub: [{k: v for k, v in e.items() if k not in ("seconds", "started")} for e in entries]
                for sub, entries in rep["code"][name].items()} == \
            {sub: [{"code": here, "engine": ENGINE_VERSION, "conversations_on_disk": 0, "n_generated": n}]
             for sub, n in runs.items()}
        assert all(e["seconds"] > 0 and e["started"] > 1.7e9 for entries in rep["code"][name].values() for e in entries)
        assert f"- {name}: greedy " in md and f"decode engine {ENGINE_VERSION}" in md
    assert f"--recompute --out {smoke['md'].resolve()}`" in md  # the command that rebuilds this very report


def _check_against_files(rep: dict, out: Path) -> None:
    """Every accuracy, paired difference, LiC P and curve of `rep`, recomputed here from the files."""
    means = {}
    for name, m in rep["models"].items():
        recs = _records(out / "models" / name / "greedy" / "transcripts.jsonl")
        assert len(recs) == 30  # 10 problems x FULL, MT-Add, MT-Refine
        for kind in KINDS:
            acc = {r["task_id"]: verify(r["turns"][-1]["assistant"], r["gold"], "strict") for r in recs
                   if r["kind"] == kind}
            means[name, kind] = acc
            assert m["strict"][kind]["mean"] == pytest.approx(np.mean(list(acc.values())), abs=1e-12)
            last = [r["turns"][-1] for r in recs if r["kind"] == kind]  # one run per problem
            fr = m["final_reply"][kind]
            assert fr["tokens"]["mean"] == pytest.approx(np.mean([t["new_tokens"] for t in last]))
            assert fr["cut"]["mean"] == pytest.approx(np.mean([t["finish_reason"] == "length" for t in last]))
            echo = [restates_user(t["user"], t["assistant"]) for t in last]
            assert fr["echo"]["mean"] == pytest.approx(np.mean(echo))
            uncut = [acc[r["task_id"]] for r in recs
                     if r["kind"] == kind and r["turns"][-1]["finish_reason"] != "length"]
            assert m["uncut_strict"][kind]["n"] == len(uncut)
            assert m["uncut_strict"][kind]["mean"] == (pytest.approx(np.mean(uncut)) if uncut else None)
        lic = _records(out / "models" / name / "lic" / "transcripts.jsonl")
        for kind in ("full", "sharded"):
            by_task: dict[str, list[float]] = {}
            for r in lic:
                if r["kind"] == kind:
                    by_task.setdefault(r["task_id"], []).append(r["score"])
            assert m["lic"][kind]["P"] == pytest.approx(100 * np.mean([np.mean(v) for v in by_task.values()]))
            right: dict[str, list[float]] = {}  # pass@N: at least one of a problem's N = 2 runs right
            for r in lic:
                if r["kind"] == kind:
                    right.setdefault(r["task_id"], []).append(verify(r["turns"][-1]["assistant"], r["gold"], "strict"))
            assert m["lic"][kind]["pass@k"]["2"]["mean"] == pytest.approx(np.mean([max(v) for v in right.values()]))
            assert m["lic"][kind]["pass^k"]["2"]["mean"] == pytest.approx(np.mean([min(v) for v in right.values()]))
    for kind in KINDS:
        a, b = means["base", kind], means["rlsta_exp", kind]
        assert rep["pairs"]["rlsta_exp - base"][kind]["diff"] == pytest.approx(np.mean([b[t] - a[t] for t in a]))
    metrics = _records(out / "runs" / "rlsta_exp" / "metrics.jsonl")
    assert rep["runs"]["rlsta_exp"]["curves"]["reward/total"] == [[r["step"], r["reward/total"]] for r in metrics
                                                                  if "reward/total" in r]


def test_numbers_equal_a_recomputation_from_the_files(smoke: dict) -> None:
    rep, out, md = smoke["report"], smoke["out"], smoke["md"]
    _check_against_files(rep, out)
    recompute = ["--out", str(md), "--recompute"]
    # --recompute rebuilds the same report from the files alone
    before, md_before = (out / "report.json").read_bytes(), md.read_text()
    assert compare.main(recompute) == 0
    assert (out / "report.json").read_bytes() == before and md.read_text() == md_before
    # A random-weight model answers nothing right: edit base's transcripts so that the numbers are not
    # all zero (4 right FULL answers, 3 MT-Add conversations repeating an earlier wrong 999) and
    # check that the recomputed report follows the files.
    path = out / "models" / "base" / "greedy" / "transcripts.jsonl"
    recs = _records(path)
    full = [r for r in recs if r["kind"] == "full"][:4]
    for r in full:
        r["turns"][-1]["assistant"] = f"The answer is {r['gold']}."
    for r in [r for r in recs if r["kind"] == "sharded"][:3]:
        r["turns"][0]["assistant"], r["turns"][-1]["assistant"] = "It is 999.", "So 999."
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert compare.main(recompute) == 0
    rep2 = json.loads((out / "report.json").read_text())
    _check_against_files(rep2, out)
    assert rep2["models"]["base"]["strict"]["full"]["mean"] >= 0.4
    inert = rep2["models"]["base"]["inertia"]["sharded"]
    assert inert["n_repeat"] >= 3 and inert["share"] == pytest.approx(inert["n_repeat"] / inert["n_eligible"])

"""experiments.exp2: the arm table is the plan's, commands, resumability and the files kept for commit."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from experiments import exp2
from jaxrl_mt.runtime import load_config_file

ROOT = Path(__file__).resolve().parents[2]


def test_arm_table_is_the_plans_seeds_and_presets() -> None:
    seeds: dict[str, list[int]] = {}
    for name, arm in exp2.ARMS.items():
        assert name.endswith(f"_s{arm.seed}")
        seeds.setdefault(name.rsplit("_s", 1)[0], []).append(arm.seed)
    assert seeds == {"rlsta": [0], "grpo": [0], "grpo_full": [0, 1, 2], "rlsta_full": [0, 1, 2], "rlsta_nv_full": [0],
                     "sft_full": [0], "dpo_full": [0], "icpo_full": [0], "rlaar_full": [0]}
    assert list(exp2.ARMS)[0] == exp2.DATA_ARM  # the data stage runs first
    # the LoRA rule's outcome: every arm but the two LoRA ones trained before it is fully fine-tuned at 1e-5
    assert [n for n, arm in exp2.ARMS.items() if arm.overrides[:2] != exp2.FULL] == ["rlsta_s0", "grpo_s0"]
    assert exp2.FULL == ("--config.lora.rank=0", "--config.rl.lr=1e-05")
    assert "--config.rl.verifier_weight=0.0" in exp2.ARMS["rlsta_nv_full_s0"].overrides
    for arm in exp2.ARMS.values():
        file, preset = arm.config.split(":")
        c = load_config_file(ROOT / file, preset)
        assert c.lora.rank == 16 and c.seed == 0  # the seed comes from the command line
    assert not exp2.ARMS["icpo_full_s0"].shares_items and not exp2.ARMS["rlaar_full_s0"].shares_items


def test_commands_name_seed_workdir_and_overrides() -> None:
    cmd = exp2.arm_command("grpo_full_s0", Path("r"))
    assert cmd == ["--config", "configs/grpo.py:experiment2", "--config.seed=0", "--config.workdir=r/grpo_full_s0",
                   "--config.lora.rank=0", "--config.rl.lr=1e-05"]
    assert exp2.arm_command("rlsta_full_s2", Path("r"))[2:4] == ["--config.seed=2",
                                                                  "--config.workdir=r/rlsta_full_s2"]


def test_finished_reads_the_last_invocation(tmp_path: Path) -> None:
    assert not exp2.finished(tmp_path)
    (tmp_path / "run_info.json").write_text(json.dumps({"exit_status": 0}))
    assert exp2.finished(tmp_path)
    (tmp_path / "run_info.json").write_text(json.dumps({"exit_status": 0, "invocations": [
        {"exit_status": 0}, {"exit_status": 137}]}))
    assert not exp2.finished(tmp_path)  # killed on its last invocation: train again (it resumes)


def test_shared_items_are_copied_not_overwritten(tmp_path: Path) -> None:
    src, dst = tmp_path / "data", tmp_path / "arm"
    with pytest.raises(SystemExit, match="train rlsta_s0 first"):
        exp2.copy_shared_items(src, dst, data_arm=exp2.DATA_ARM)
    src.mkdir()
    for f in ("histories.jsonl", "histories.jsonl.meta.json", "train_items.jsonl", "train_items.jsonl.stats.json",
              "metrics.jsonl"):
        (src / f).write_text(f)
    dst.mkdir()
    (dst / "histories.jsonl").write_text("mine")
    copied = exp2.copy_shared_items(src, dst)
    assert sorted(p.name for p in copied) == ["histories.jsonl.meta.json", "train_items.jsonl",
                                              "train_items.jsonl.stats.json"]
    assert (dst / "histories.jsonl").read_text() == "mine" and not (dst / "metrics.jsonl").exists()


def test_list_names_every_arm_and_refuses_unknown(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert exp2.main(["list", "--runs", str(tmp_path), "--results", str(tmp_path / "r")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x.split()[0] for x in lines] == list(exp2.ARMS) and all("to train" in x for x in lines)
    with pytest.raises(SystemExit, match="unknown"):
        exp2.main(["list", "--arms", "rlsta_s0,nope"])


def test_data_stage_files_are_kept_and_restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's bookkeeping around each training (the training itself replaced by one that writes the data
    stage's files and a run_info.json, as `train_arm` does)."""
    trained = []

    def fake_train_arm(cmd: list[str], cwd: Path) -> int:
        wd = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.workdir=")))
        trained.append((wd.name, sorted(p.name for p in wd.glob("*.jsonl"))))
        for f in ("histories.jsonl", "train_items.jsonl"):
            if not (wd / f).exists():
                (wd / f).write_text(f"{f} of {wd.name}")
        (wd / "run_info.json").write_text(json.dumps({"exit_status": 0}))
        return 0

    monkeypatch.setattr(subprocess, "call", fake_train_arm)
    runs, results, data = tmp_path / "runs", tmp_path / "results", tmp_path / "data"
    (runs / "rlsta_s0").mkdir(parents=True)
    assert exp2.train(["rlsta_s0", "grpo_s0"], runs, results, data) == 0
    assert trained == [("rlsta_s0", []), ("grpo_s0", ["histories.jsonl", "train_items.jsonl"])]  # grpo: the copies
    assert (data / "train_items.jsonl").read_text() == "train_items.jsonl of rlsta_s0"  # kept for commit
    assert (results / "grpo_s0" / "run_info.json").is_file()
    # a fresh checkout whose data arm had not finished (no committed run_info): it starts from the committed data
    trained.clear()
    results2 = tmp_path / "results2"
    assert exp2.train(["rlsta_s0"], tmp_path / "fresh", results2, data) == 0
    assert trained == [("rlsta_s0", ["histories.jsonl", "train_items.jsonl"])]
    assert exp2.train(["rlsta_s0"], tmp_path / "fresh", results2, data) == 0 and len(trained) == 1  # finished
    # histories kept from a data stage killed while filtering: restored alone
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "histories.jsonl").write_text("h")
    trained.clear()
    assert exp2.train(["rlsta_s0"], tmp_path / "fresh2", tmp_path / "results3", partial) == 0
    assert trained == [("rlsta_s0", ["histories.jsonl"])]


def test_a_fresh_checkout_skips_committed_arms_and_shares_the_committed_items(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    trained = []

    def fake_train_arm(cmd: list[str], cwd: Path) -> int:
        wd = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.workdir=")))
        trained.append((wd.name, sorted(p.name for p in wd.glob("*.jsonl"))))
        (wd / "run_info.json").write_text(json.dumps({"exit_status": 0}))
        return 0

    monkeypatch.setattr(subprocess, "call", fake_train_arm)
    results, data = tmp_path / "results", tmp_path / "data"
    (results / "rlsta_s0").mkdir(parents=True)
    (results / "rlsta_s0" / "run_info.json").write_text(json.dumps({"exit_status": 0}))
    data.mkdir()
    for f in ("histories.jsonl", "train_items.jsonl"):
        (data / f).write_text(f)
    assert exp2.train(["rlsta_s0", "grpo_s0"], tmp_path / "runs", results, data) == 0
    assert trained == [("grpo_s0", ["histories.jsonl", "train_items.jsonl"])]  # rlsta_s0 not retrained


def test_the_filter_samples_of_the_first_supervised_arm_go_to_the_next(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def fake_train_arm(cmd: list[str], cwd: Path) -> int:
        wd = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.workdir=")))
        texts = wd / exp2.FILTER_TEXTS
        seen.append((wd.name, texts.read_text() if texts.exists() else None))
        if wd.name == "sft_full_s0":
            texts.write_text("sampled by sft_full_s0")
        (wd / "run_info.json").write_text(json.dumps({"exit_status": 0}))
        return 0

    monkeypatch.setattr(subprocess, "call", fake_train_arm)
    data = tmp_path / "data"
    data.mkdir()
    for f in ("histories.jsonl", "train_items.jsonl"):
        (data / f).write_text(f)
    assert exp2.train(["grpo_s0", "sft_full_s0", "dpo_full_s0"], tmp_path / "runs", tmp_path / "results", data) == 0
    assert seen == [("grpo_s0", None), ("sft_full_s0", None), ("dpo_full_s0", "sampled by sft_full_s0")]
    assert (data / exp2.FILTER_TEXTS).read_text() == "sampled by sft_full_s0"  # kept with the data stage (commit)
    from jaxrl_mt.rl.supervised import FILTER_TEXTS

    assert exp2.FILTER_TEXTS == FILTER_TEXTS


def test_the_evaluation_gives_every_model_the_same_settings(tmp_path: Path) -> None:
    from configs.rlsta import EXP2_BUDGET, EXP2_SYSTEM
    from experiments.compare import parse, resolve_models

    results, runs = tmp_path / "results", tmp_path / "runs"
    for n in ("grpo_s0", "rlsta_s0"):  # the LoRA arms' committed adapters
        (results / n / "adapter").mkdir(parents=True)
        (results / n / "adapter" / "adapter_config.json").write_text("{}")
    c = exp2.comparison(["rlsta_s0", "grpo_s0", "grpo_full_s0", "rlsta_full_s0", "rlaar_full_s0"], runs, results,
                        tmp_path / "r.md", ["rlaar_full_s0"])
    assert c.gzip and c.base == exp2.BASE and c.title == exp2.TITLE and c.out == str(tmp_path / "r.md")
    models = resolve_models(c.models, exp2.BASE)
    assert [(m["name"], m["spec"]) for m in models] == [
        ("base", exp2.BASE),
        ("rlsta_s0", f"{exp2.BASE}+lora:{results / 'rlsta_s0' / 'adapter'}"),
        ("grpo_s0", f"{exp2.BASE}+lora:{results / 'grpo_s0' / 'adapter'}"),
        ("grpo_full_s0", f"workdir:{runs / 'grpo_full_s0'}"),  # full fine-tuning: not committed
        ("rlsta_full_s0", f"workdir:{runs / 'rlsta_full_s0'}"),
        ("rlaar_full_s0", f"workdir:{runs / 'rlaar_full_s0'}"),
        ("sedt", exp2.BASE), ("recap", exp2.BASE), ("base_abstain", exp2.BASE)]
    # LiC: base, GRPO and RLSTA (fully fine-tuned, and the LoRA ones run before the LoRA rule's outcome) + extra
    assert c.greedy_only == ("sedt", "recap", "base_abstain")
    assert (c.max_new_tokens, c.system) == (EXP2_BUDGET, EXP2_SYSTEM)
    assert (c.strategy, c.recap) == (("sedt=sedt",), ("recap",))
    assert c.abstain_models == ("rlaar_full_s0", "base_abstain")  # RLAAR and its control: the same instruction
    assert c.run_files == str(results) and c.heldout == str(exp2.HELDOUT)
    assert c.pairs_with == ("base", "grpo_full_s0", "rlsta_full_s0")  # differences against base, GRPO and RLSTA
    assert c.pairs == ("rlaar_full_s0:base_abstain",)  # and RLAAR against its control
    assert exp2.comparison(["grpo_s0"], runs, results, tmp_path / "r.md", []).pairs == ()  # no RLAAR arm
    # the command line the manifest records builds the same comparison; options passed to exp2 override its fields
    assert parse(c.argv()) == c and f"--system '{EXP2_SYSTEM}'" in c.command_line()
    assert parse(["--limit", "4", "--greedy-only", "a,b"], c) == dataclasses.replace(c, limit=4, greedy_only=("a", "b"))
    r = exp2.reproduction("grpo_s0", runs, results, tmp_path / "p.md")
    assert (r.models, r.lic_runs, r.system, r.abstain_models) == (
        (f"grpo_s0={exp2.BASE}+lora:{results / 'grpo_s0' / 'adapter'}",), 0, EXP2_SYSTEM, ())
    with pytest.raises(SystemExit, match="--lic-extra"):
        exp2.main(["evaluate", "--runs", str(runs), "--results", str(results), "--lic-extra", "sft_full_s0"])


def test_evaluate_calls_compare_run_with_the_comparison(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`exp2 evaluate` hands compare.run a Comparison (no command-line strings), the passed options applied."""
    seen = []
    monkeypatch.setattr(exp2.compare, "run", lambda c: seen.append(c) or 0)
    monkeypatch.setattr(exp2, "unevaluable", lambda *a: [])
    results = tmp_path / "results"
    (results / "grpo_s0").mkdir(parents=True)
    monkeypatch.setattr(exp2, "finished", lambda wd: wd == results / "grpo_s0")
    assert exp2.main(["evaluate", "--runs", str(tmp_path / "runs"), "--results", str(results), "--out",
                      str(tmp_path / "r.md"), "--limit", "3"]) == 0
    assert [c.limit for c in seen] == [3]
    assert seen[0] == dataclasses.replace(exp2.comparison(["grpo_s0"], tmp_path / "runs", results, tmp_path / "r.md",
                                                          []), limit=3)


def test_icpo_and_rlaar_train_on_the_problems_of_the_shared_items(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from jaxrl_mt.data.loaders import load_tasks_jsonl
    from jaxrl_mt.rl.histories import load_items

    committed = exp2.ROOT / exp2.DATA
    items = load_items(committed / "train_items.jsonl")
    tasks = load_tasks_jsonl(committed / exp2.PROBLEMS)  # committed, and recomputed here
    assert [t.task_id for t in tasks] == sorted({it.task_id for it in items}) and len(tasks) == 61
    data = tmp_path / "data"
    data.mkdir()
    shutil.copyfile(committed / "train_items.jsonl", data / "train_items.jsonl")
    assert exp2.write_item_problems(data).read_bytes() == (committed / exp2.PROBLEMS).read_bytes()
    full = {it.task_id: it.anchor_prompt for it in items if it.kind == "sharded"}  # MT-Add keeps the facts
    assert all(full[t.task_id] == t.full_prompt for t in tasks if t.task_id in full)
    for arm in ("icpo_full_s0", "rlaar_full_s0"):
        assert f"--config.data.add_source=tasks:{exp2.DATA / exp2.PROBLEMS}" in exp2.arm_command(arm)
    assert exp2.arm_command("icpo_full_s0", Path("r"), Path("d"), ["--config.rl.steps=1"])[-2:] == [
        f"--config.data.add_source=tasks:{Path('d') / exp2.PROBLEMS}", "--config.rl.steps=1"]
    seen = []

    def fake_train_arm(cmd: list[str], cwd: Path) -> int:
        seen.append((data / exp2.PROBLEMS).is_file())
        wd = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.workdir=")))
        (wd / "run_info.json").write_text(json.dumps({"exit_status": 0}))
        return 0

    monkeypatch.setattr(subprocess, "call", fake_train_arm)
    (data / exp2.PROBLEMS).unlink()
    (tmp_path / "runs" / "icpo_full_s0").mkdir(parents=True)
    assert exp2.train(["icpo_full_s0"], tmp_path / "runs", tmp_path / "results", data) == 0
    assert seen == [True]  # written from the data stage before ICPO trained


def _greedy_folder(report: Path, name: str, right: dict[str, list[bool]], kinds: tuple[str, ...]) -> None:
    """A finished greedy evaluation: for each kind, problem i's last reply is right when right[kind][i]."""
    from experiments.common import compress_transcripts

    wd = report / "models" / name / "greedy"
    wd.mkdir(parents=True)
    recs = [{"conv_id": f"p{i}|{k}|0", "task_id": f"p{i}", "kind": k, "run": 0, "gold": "5", "score": 0.0,
             "turns": [{"assistant": "The answer is 5." if ok else "The answer is 7."}]}
            for k in kinds for i, ok in enumerate(right[k])]
    (wd / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    compress_transcripts(wd)


def test_best_other_arm_is_the_plans_rule_on_the_greedy_evaluations(tmp_path: Path) -> None:
    both = ("full", "sharded", "mt_refine")
    # multi-turn (mean of MT-Add and MT-Refine per problem): sft 2/4, dpo 2/4 (a tie: sft comes first),
    # icpo 1/4; base, GRPO and RLSTA better but not "other"; recap (no MT-Refine) has none
    arms = {"base": ([1, 1], [1, 1], [1, 1]), "grpo_full_s1": ([1, 1], [1, 1], [1, 1]),
            "rlsta_full_s1": ([1, 1], [1, 1], [1, 1]), "rlsta_s0": ([1, 1], [1, 1], [1, 1]),
            "sft_full_s0": ([0, 0], [1, 0], [1, 0]), "dpo_full_s0": ([1, 1], [1, 1], [0, 0]),
            "icpo_full_s0": ([1, 1], [1, 0], [0, 0])}
    for name, cols in arms.items():
        _greedy_folder(tmp_path, name, dict(zip(both, [list(map(bool, c)) for c in cols])), both)
    _greedy_folder(tmp_path, "recap", {"full": [True, True], "sharded": [True, True]}, ("full", "sharded"))
    names = ["grpo_full_s1", "rlsta_full_s1", "rlsta_s0", "sft_full_s0", "dpo_full_s0", "icpo_full_s0", "recap"]
    best, acc = exp2.best_other_arm(tmp_path, names)
    assert (best, acc) == ("sft_full_s0", {"sft_full_s0": 0.5, "dpo_full_s0": 0.5, "icpo_full_s0": 0.25})
    assert exp2.best_other_arm(tmp_path, ["dpo_full_s0", "sft_full_s0"])[0] == "dpo_full_s0"
    with pytest.raises(SystemExit, match=r"\['rlaar_full_s0'\] are not finished"):
        exp2.best_other_arm(tmp_path, [*names, "rlaar_full_s0"])


def test_again_retrains_lost_full_weights_and_checks_the_committed_metrics(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A fully fine-tuned arm's weights live only in its workdir; a new checkout trains it again (``--again``)
    and the new run must repeat the committed metrics.jsonl, timings aside."""
    metrics = {"grpo_full_s1": [{"step": 1, "train/loss": 0.5, "perf/step_s": 9.0}]}
    trained = []

    def fake_train_arm(cmd: list[str], cwd: Path) -> int:
        wd = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.workdir=")))
        trained.append(wd.name)
        (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics[wd.name]))
        (wd / "run_info.json").write_text(json.dumps({"exit_status": 0, "wall_s": 7.0}))
        return 0

    monkeypatch.setattr(subprocess, "call", fake_train_arm)
    results, data = tmp_path / "results", tmp_path / "data"
    data.mkdir()
    for f in ("histories.jsonl", "train_items.jsonl"):
        (data / f).write_text(f)
    committed = results / "grpo_full_s1"
    committed.mkdir(parents=True)
    (committed / "run_info.json").write_text(json.dumps({"exit_status": 0, "wall_s": 3.0}))
    (committed / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 0.5, "perf/step_s": 4.0}) + "\n")
    (results / "grpo_s0" / "adapter").mkdir(parents=True)  # a LoRA arm: its adapter is committed
    (results / "grpo_s0" / "run_info.json").write_text(json.dumps({"exit_status": 0}))
    (results / "grpo_s0" / "adapter" / "adapter_config.json").write_text("{}")
    runs = tmp_path / "runs"
    assert exp2.train(["grpo_s0", "grpo_full_s1"], runs, results, data) == 0 and trained == []  # without --again
    assert exp2.unevaluable(["grpo_s0", "grpo_full_s1"], runs, results, tmp_path / "report", set()) == ["grpo_full_s1"]
    with pytest.raises(SystemExit, match="train --again --arms grpo_full_s1"):
        exp2.main(["evaluate", "--arms", "grpo_full_s1", "--runs", str(runs), "--results", str(results),
                   "--out", str(tmp_path / "report.md")])
    assert exp2.train(["grpo_s0", "grpo_full_s1"], runs, results, data, again=True) == 0
    assert trained == ["grpo_full_s1"]  # the adapter arm is not trained again
    assert json.loads((committed / "run_info.json").read_text())["wall_s"] == 7.0  # the new run's files kept
    assert exp2.unevaluable(["grpo_s0", "grpo_full_s1"], runs, results, tmp_path / "report", set()) == []
    # a retraining that does not repeat the committed run: status 1, the committed files untouched
    shutil.rmtree(runs)
    metrics["grpo_full_s1"] = [{"step": 1, "train/loss": 0.25, "perf/step_s": 9.0}]
    (committed / "run_info.json").write_text(json.dumps({"exit_status": 0, "wall_s": 3.0}))
    assert exp2.train(["grpo_full_s1"], runs, results, data, again=True) == 1
    assert json.loads((committed / "run_info.json").read_text())["wall_s"] == 3.0
    assert exp2.train(["grpo_full_s1"], runs, results, data, again=True) == 1  # run again: checked again, kept
    assert json.loads((committed / "run_info.json").read_text())["wall_s"] == 3.0 and len(trained) == 2
    assert exp2.same_training(committed, runs / "grpo_full_s1") == [
        "record 0: {'step': 1, 'train/loss': 0.5} != {'step': 1, 'train/loss': 0.25}"]
    # an evaluation already on disk needs no weights
    for sub in ("greedy",):
        (tmp_path / "report" / "models" / "grpo_full_s1" / sub).mkdir(parents=True)
        (tmp_path / "report" / "models" / "grpo_full_s1" / sub / "transcripts.jsonl.gz").write_bytes(b"")
    shutil.rmtree(runs)
    assert exp2.unevaluable(["grpo_full_s1"], runs, results, tmp_path / "report", set()) == []
    assert exp2.unevaluable(["grpo_full_s1"], runs, results, tmp_path / "report", {"grpo_full_s1"}) == ["grpo_full_s1"]

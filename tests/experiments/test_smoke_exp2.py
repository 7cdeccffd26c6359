"""Issue 35's pipeline at CI size, for the arms the first smoke test (test_smoke.py) does not train: SFT, DPO,
ICPO and RLAAR through ``experiments.exp2 all``: train (the ``experiment2`` presets on the tiny chat model, two
steps each: LoRA-GRPO with its adapter exported and committed in bfloat16, the others fully fine-tuned, as the
plan's LoRA rule chose), evaluate (base, the five arms, SeDT and RECAP on the base model, one report), LiC for the
best other arm, and the committed adapter evaluated again.

The tiny random model solves nothing, so the data stage is written here as the real one would be: histories of
real training problems and the filter's samples (a right single-turn answer, a wrong multi-turn one), under the
key the SFT run computes; ICPO's and RLAAR's problems are derived from those items by the driver.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from configs.rlsta import EXP2_SYSTEM
from experiments import exp2, heldout
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.rl.histories import TrainItem, save_items, save_texts, texts_key

# 150 s (its fixture trains five arms): run by hand (-m slow) since exp2 finished; the suite budget (issue 52).
# SFT, DPO, ICPO and RLAAR training stay in CI through tests/rl, the comparison's driver through test_smoke.py.
pytestmark = pytest.mark.slow

ARMS = ["grpo_s0", "sft_full_s0", "dpo_full_s0", "icpo_full_s0", "rlaar_full_s0"]  # one LoRA arm, then full ones
SET = {"rl.steps": 2, "rl.batch_size": 2, "rl.group_size": 2, "rl.max_new_tokens": 6, "history.max_new_tokens": 4,
       "eval.max_new_tokens": 6, "eval.every": 1, "eval.probe_limit": 2, "eval.probe_every": 0,
       "checkpoint.every": 2, "rl.remat": False, "rl.max_batch": 16, "filter.k": 1}


def _data_stage(data: Path, model: str) -> list[TrainItem]:
    tasks = load_source("family:train:6:1")
    items = [TrainItem(item_id=f"{t.task_id}|sharded|0", task_id=t.task_id, kind="sharded",
                       history=(("user", t.target + "\n- " + t.conditions[0]), ("assistant", "OK.")),
                       last_user=" ".join(t.conditions[1:]), anchor_prompt=t.full_prompt, merged_user=t.full_prompt,
                       answer=t.answer) for t in tasks]
    data.mkdir(parents=True)
    save_items(data / "histories.jsonl", items, {"n_items": len(items)})
    save_items(data / "train_items.jsonl", items, {"n_items": len(items), "n_kept": len(items)})
    key = texts_key(items, model=model, seed=0 + 2, k=1, temperature=0.5, max_new_tokens=6, system=EXP2_SYSTEM)
    save_texts(data / exp2.FILTER_TEXTS, key, items, [f"The answer is {it.answer}." for it in items],
               ["The answer is 0." for _ in items], k=1)
    return items


@pytest.fixture(scope="module")
def smoke2(tmp_path_factory: pytest.TempPathFactory, tiny_chat_model_dir: Path) -> dict:
    root = tmp_path_factory.mktemp("smoke2")
    model = str(tiny_chat_model_dir)
    held = root / "heldout.jsonl"
    assert heldout.main(["--out", str(held), "--seed", "0", "--one-step", "4", "--two-step", "2"]) == 0
    data, runs, results = root / "data", root / "runs", root / "results"
    items = _data_stage(data, model)
    sets = [f"{k}={v}" for k, v in {**SET, "model": model, "eval.probe_source": f"tasks:{held}"}.items()]
    args = ["--runs", str(runs), "--results", str(results), "--data", str(data)]
    md = root / "report.md"
    # the whole comparison: train, evaluate, LiC of the best other arm, the first arm evaluated again
    printed = {"out": io.StringIO(), "err": io.StringIO()}
    with contextlib.redirect_stdout(printed["out"]), contextlib.redirect_stderr(printed["err"]):
        assert exp2.main(["all", "--arms", ",".join(ARMS), *args, *[x for s in sets for x in ("--set", s)],
                          "--out", str(md), "--base", model, "--heldout", str(held), "--limit", "4", "--lic-runs", "2",
                          "--lic-every", "2", "--max-new-tokens", "6", "--bootstrap", "50"]) == 0
    out = md.with_suffix("")
    return {"root": root, "runs": runs, "results": results, "data": data, "items": items, "md": md, "out": out,
            "model": model, "held": held, "printed": {k: v.getvalue() for k, v in printed.items()},
            "report": json.loads((out / "report.json").read_text())}


def _records(folder: Path) -> list[dict]:
    import gzip

    return [json.loads(x) for x in gzip.open(folder / "transcripts.jsonl.gz", "rt") if x.strip()]


def test_each_arm_trained_from_the_shared_data_and_a_lora_arm_left_a_bf16_adapter(smoke2: dict) -> None:
    runs, results, data = smoke2["runs"], smoke2["results"], smoke2["data"]
    for arm in ARMS:
        assert exp2.finished(results / arm), arm
        lora = json.loads((runs / arm / "config.json").read_text())["lora"]["rank"]
        assert lora == (16 if arm == "grpo_s0" else 0), arm  # the LoRA rule's outcome: full fine-tuning
        assert (results / arm / "adapter").is_dir() == (arm == "grpo_s0"), arm  # full weights: not committed
    cfg = json.loads((results / "grpo_s0" / "adapter" / "adapter_config.json").read_text())
    assert cfg["r"] == 16
    raw = (results / "grpo_s0" / "adapter" / "adapter_model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])  # the safetensors header
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    # SFT and DPO made their rows from the data stage's filter samples (the random model writes no such text):
    # one per history, none sampled again (a new sampling would have rewritten the cache)
    answers = {it.task_id: it.answer for it in smoke2["items"]}
    for arm, field in (("sft_full_s0", "target"), ("dpo_full_s0", "chosen")):
        rows = [json.loads(x) for f in ("train_rows.jsonl", "val_rows.jsonl")
                for x in (runs / arm / f).read_text().splitlines()]
        assert sorted(r["task_id"] for r in rows) == sorted(answers), arm
        assert all(r[field] == f"The answer is {answers[r['task_id']]}." for r in rows), arm
        assert (runs / arm / exp2.FILTER_TEXTS).read_bytes() == (data / exp2.FILTER_TEXTS).read_bytes(), arm
    # ICPO and RLAAR made their prompts from the items' problems
    problems = [json.loads(x)["task_id"] for x in (data / exp2.PROBLEMS).read_text().splitlines()]
    assert problems == sorted(it.task_id for it in smoke2["items"])
    for arm in ("icpo_full_s0", "rlaar_full_s0"):
        assert json.loads((runs / arm / "config.json").read_text())["data"]["add_source"] == \
            f"tasks:{data / exp2.PROBLEMS}"


def test_the_report_holds_every_arm_and_the_inference_arms(smoke2: dict) -> None:
    rep, out = smoke2["report"], smoke2["out"]
    assert list(rep["models"]) == ["base", *ARMS, "sedt", "recap", "base_abstain"]
    greedy = {m: _records(out / "models" / m / "greedy") for m in rep["models"]}
    for m, recs in greedy.items():
        kinds = {r["kind"] for r in recs}
        assert kinds == ({"full", "recap"} if m == "recap" else {"full", "sharded", "mt_refine"}), m
        assert len(recs) == (8 if m == "recap" else 12), m  # 4 problems, every scenario
    cfg = {m: json.loads((out / "models" / m / "greedy" / "eval_config.json").read_text()) for m in rep["models"]}
    assert {c["system_prompt"] for c in cfg.values()} == {EXP2_SYSTEM}  # one prompt; RLAAR's instruction on top:
    assert {m for m, c in cfg.items() if c.get("abstain")} == {"rlaar_full_s0", "base_abstain"}  # and its control
    assert "rlaar_full_s0 - base_abstain" in rep["pairs"]
    assert {m for m, c in cfg.items() if c["strategy"] != "plain"} == {"sedt"}
    assert {c["max_new_tokens"] for c in cfg.values()} == {6}
    # LiC for base and the best other arm: the random model answers nothing right, every candidate ties at 0
    # and the first in the table wins
    assert {m for m in rep["models"] if (out / "models" / m / "lic").is_dir()} == {"base", "grpo_s0", "sft_full_s0"}
    assert "best other arm by greedy multi-turn accuracy: sft_full_s0 (" in smoke2["printed"]["err"]
    for arm in ARMS:
        assert rep["runs"][arm]["curves"], arm  # the committed run files joined the report
    for m in rep["models"]:  # each evaluation's wall time, for the comparison's total compute
        entry = json.loads((out / "models" / m / "greedy" / "code.json").read_text())[-1]
        assert entry["n_generated"] == (8 if m == "recap" else 12) and entry["seconds"] > 0, m
    md = smoke2["md"].read_text()
    assert "12 conversations in" in md and md.startswith(f"# {exp2.TITLE}\n")
    assert f"--system '{EXP2_SYSTEM}'" in md  # the command as a shell would take it


def test_a_committed_adapter_evaluated_again_reproduces_its_records_and_a_changed_budget_does_not(
        smoke2: dict, capsys: pytest.CaptureFixture) -> None:
    args = ["--runs", str(smoke2["runs"]), "--results", str(smoke2["results"]), "--out", str(smoke2["md"]),
            "--base", smoke2["model"], "--heldout", str(smoke2["held"]), "--limit", "4", "--bootstrap", "50"]
    # `all` evaluated the first arm's committed adapter again (not rlsta_s0's: not among these arms)
    assert "grpo_s0: 12/12 conversations identical" in smoke2["printed"]["out"]
    assert "reproduced exactly" in smoke2["printed"]["out"]
    again = smoke2["runs"] / "reproduce" / "report" / "models" / "grpo_s0"
    assert (again / "greedy").is_dir() and not (again / "lic").exists()  # greedy only
    # a fully fine-tuned arm from its workdir too; with another budget the records differ (not resumed)
    assert exp2.main(["reproduce", "--arms", "sft_full_s0", *args, "--max-new-tokens", "6"]) == 0
    assert "sft_full_s0: 12/12 conversations identical" in capsys.readouterr().out
    assert exp2.main(["reproduce", "--arms", "sft_full_s0", *args, "--max-new-tokens", "5"]) == 1
    assert "NOT reproduced" in capsys.readouterr().out


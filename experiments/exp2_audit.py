"""The audit's numbers for the first comparison (issue 56, item 1), from the committed files alone.

    python -m experiments.exp2_audit [--report docs/results/exp2/report] [--out FILE.json]

Reads ``docs/results/heldout.jsonl`` (the held-out problems and their operations), the report
folder's greedy transcripts, the training problems and items of ``docs/results/exp2/data`` and
RLAAR's ``metrics.jsonl``; prints every number ``docs/results/experiment2.md`` quotes for the
audit's eight points and the shortcut rules, and writes them to ``--out`` as JSON. Scores are the
strict verifier's on the last reply (the report's); CIs are the report's bootstrap (1000
replicates over problems, seed 0; paired by problem).

Shortcut rules (a rule's answer to a problem's FULL prompt, right when it equals the gold number):
``add`` every number of the prompt, the ``last``, the ``first``, the ``largest``, and ``echo``:
the last user message itself read as the reply (FULL: the prompt; MT-Add: the last shard, as
base's greedy conversations sent it).

The extractor fix (point 7): ``legacy_value`` is the strict extractor before issue 56 (the last
``\\boxed{}`` > the last ``####`` line > the last answer phrase > the last number), read with the
verifier's own marker scans; ``extractor fix`` counts the greedy last-reply verdicts that the fix
changed and gives every arm's FULL / multi-turn accuracy under both rules.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jaxrl_mt.rewards import verifier as V
from jaxrl_mt.rewards.think import answer_part
from jaxrl_mt.rewards.verifier import extract_answer, find_numbers, parse_number, verify
from experiments import analysis as A
from experiments.common import load_records, write_json
from experiments.report import kind_scores

__all__ = ["legacy_value", "legacy_verify", "main", "rlaar_training", "rule_answers", "shortcut_scores"]

HELDOUT = Path("docs/results/heldout.jsonl")
DATA = Path("docs/results/exp2/data")
REPORT = Path("docs/results/exp2/report")
RULES = ("add", "last", "first", "largest")


def rule_answers(prompt: str) -> dict[str, float | None]:
    """Each shortcut rule's answer to one prompt (None when the prompt holds no number)."""
    nums = find_numbers(prompt)
    if not nums:
        return dict.fromkeys(RULES)
    return {"add": float(sum(nums)), "last": nums[-1], "first": nums[0], "largest": max(nums)}


def _equal(a: float | None, b: float) -> float:
    return float(a is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12))


def shortcut_scores(problems: list[dict[str, Any]], last_users: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Rule -> task -> 0/1 on the held-out problems; ``echo_full`` / ``echo_mt_add`` read the last user
    message (``last_users``: task -> MT-Add's last user message) as the reply."""
    out: dict[str, dict[str, float]] = {r: {} for r in (*RULES, "echo_full", "echo_mt_add")}
    for p in problems:
        gold, t = parse_number(p["answer"]), p["task_id"]
        for rule, value in rule_answers(p["full_prompt"]).items():
            out[rule][t] = _equal(value, gold)
        out["echo_full"][t] = verify(p["full_prompt"], p["answer"])
        if t in last_users:
            out["echo_mt_add"][t] = verify(last_users[t], p["answer"])
    return out


def legacy_value(text: str) -> float | None:
    """The strict extractor's value before issue 56: the last boxed answer, else the last ``####``
    line, else the last answer phrase (whatever their order), else the last number."""
    if len(text) > V.MAX_CHECKED_CHARS:
        return None
    text = answer_part(text)
    marked = V._marked_values(text)  # boxed (last first), then ####, then answer phrases
    return marked[0] if marked else V._last_number(text)


def legacy_verify(text: str, gold: str) -> float:
    """``verify(text, gold, "strict")`` with ``legacy_value`` as the extractor."""
    value, want = legacy_value(text), parse_number(gold)
    return float(value is not None and want is not None and _equal(value, want) == 1.0)


def _legacy_kind_scores(recs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``kind_scores(recs, "strict")`` under ``legacy_verify``."""
    out = {k: {t: m[0] for t, m in A._last_reply_means(
        recs, k, lambda r: (legacy_verify(r["turns"][-1]["assistant"], r["gold"]),)).items()}
        for k in ("full", "sharded", "mt_refine")}
    both = set(out["sharded"]) & set(out["mt_refine"])
    out["multi"] = {t: (out["sharded"][t] + out["mt_refine"][t]) / 2 for t in sorted(both)}
    return out


def _extractor_fix(report: Path) -> dict[str, Any]:
    """The greedy verdicts the fix changed, and each arm's FULL / multi-turn mean under both rules."""
    changed: list[str] = []
    n = 0
    arms: dict[str, str] = {}
    for d in sorted((report / "models").iterdir()):
        recs = load_records(d / "greedy")
        for r in recs:
            n += 1
            reply = r["turns"][-1]["assistant"]
            old, new = legacy_verify(reply, r["gold"]), verify(reply, r["gold"])
            if old != new:
                changed.append(f"{d.name} {r['task_id']}|{r['kind']} {old:.0f} -> {new:.0f}")
        old_sc, new_sc = _legacy_kind_scores(recs), kind_scores(recs, "strict")
        cells = []
        for k in ("full", "multi"):
            if new_sc.get(k):
                o, w = (100 * sum(x[k].values()) / len(x[k]) for x in (old_sc, new_sc))
                cells.append(f"{k} {o:.1f} -> {w:.1f}")
        arms[d.name] = ", ".join(cells)
    return {"conversations": n, "verdicts changed": len(changed),
            "now right": sum(c.endswith("-> 1") for c in changed), "changes": changed, "arms": arms}


def _answer(record: Mapping[str, Any]) -> float | None:
    """The strict extractor's value of a conversation's last reply."""
    return parse_number(extract_answer(record["turns"][-1]["assistant"]))


def _pct(d: Mapping[str, float]) -> str:
    return f"{100 * d['mean']:.1f} [{100 * d['lo']:.1f}, {100 * d['hi']:.1f}] (n = {d['n']})"


def _diff(d: Mapping[str, float]) -> str:
    return f"{100 * d['diff']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}] (n = {d['n']})"


def _subset(scores: Mapping[str, float], keep: Callable[[str], bool]) -> dict[str, float]:
    return {t: v for t, v in scores.items() if keep(t)}


def _ops_shares(path: Path) -> dict[str, Any]:
    """Operation counts of a problem file's ``metadata.synthetic_ops`` and its share of all-"+" problems."""
    ops: dict[str, int] = {}
    all_plus = n = 0
    for line in path.read_text().splitlines():
        p = json.loads(line)
        o = p["metadata"]["synthetic_ops"]
        n += 1
        all_plus += all(x == "+" for x in o)
        for x in o:
            ops[x] = ops.get(x, 0) + 1
    return {"problems": n, "all_plus": all_plus, "ops": dict(sorted(ops.items()))}


def rlaar_training(metrics: Path) -> dict[str, Any]:
    """RLAAR's training steps: how many rewarded an abstention, and the share of unsolvable prompts."""
    steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("kind") == "train"]
    frac = [r.get("curriculum/unsolvable_frac", 0.0) for r in steps]
    return {"steps": len(steps), "steps_abstain_reward_above_0": sum(r.get("reward/abstain", 0.0) > 0 for r in steps),
            "steps_unsolvable_abstain_above_0": sum(r.get("reward/unsolvable_abstain", 0.0) > 0 for r in steps),
            "steps_with_unsolvable": sum(f > 0 for f in frac), "mean_unsolvable_frac": sum(frac) / max(len(frac), 1)}


def audit(report: Path = REPORT, heldout: Path = HELDOUT, data: Path = DATA) -> dict[str, Any]:
    """Every audit number as ``name -> formatted string`` (see the module docstring)."""
    problems = [json.loads(x) for x in heldout.read_text().splitlines() if x.strip()]
    ops = {p["task_id"]: p["metadata"]["synthetic_ops"] for p in problems}
    plus = {t for t, o in ops.items() if all(x == "+" for x in o)}
    minus = {t for t, o in ops.items() if "-" in o}
    recs = {m: load_records(report / "models" / m / "greedy") for m in
            ("base", "grpo_s0", "grpo_full_s0", "rlsta_full_s0", "rlsta_full_s1", "rlsta_nv_full_s0", "sft_full_s0",
             "rlaar_full_s0", "base_abstain", "icpo_full_s0")}
    last_users = {r["task_id"]: r["turns"][-1]["user"] for r in recs["base"] if r["kind"] == "sharded"}
    out: dict[str, Any] = {"held-out problems": len(problems), "problems with a '-'": len(minus),
                           "all '+' problems": f"{len(plus)} ({100 * len(plus) / len(problems):.2f}%)"}
    for rule, sc in shortcut_scores(problems, last_users).items():
        out[f"shortcut {rule}"] = _pct(A.bootstrap_mean(sc))
        out[f"shortcut {rule} on all-'+' problems"] = _pct(A.bootstrap_mean(_subset(sc, plus.__contains__)))
    out["held-out problems' operations"] = _ops_shares(heldout)
    out["training problems' operations"] = _ops_shares(data / "train_problems.jsonl")
    items = [json.loads(x) for x in (data / "train_items.jsonl").read_text().splitlines()]
    train_ops = {json.loads(x)["task_id"]: json.loads(x)["metadata"]["synthetic_ops"]
                 for x in (data / "train_problems.jsonl").read_text().splitlines()}
    n_plus = sum(all(o == "+" for o in train_ops[i["task_id"]]) for i in items)
    out["training items from all-'+' problems"] = f"{n_plus} of {len(items)}"
    sums = {p["task_id"]: float(sum(find_numbers(p["full_prompt"]))) for p in problems}
    for m in ("rlaar_full_s0", "sft_full_s0", "base"):
        full = [r for r in recs[m] if r["kind"] == "full"]
        is_sum = sum(_equal(_answer(r), sums[r["task_id"]]) for r in full)
        out[f"{m} FULL answers equal to the sum of the numbers"] = f"{100 * is_sum / len(full):.1f}% of {len(full)}"
    sc = {m: kind_scores(r, "strict") for m, r in recs.items()}
    for a, b, kind, keep, name in [
        ("base_abstain", "rlaar_full_s0", "full", minus, "problems with a '-'"),
        ("base_abstain", "rlaar_full_s0", "full", plus, "all-'+' problems"),
        ("base", "sft_full_s0", "multi", minus, "problems with a '-'"),
        ("base", "sft_full_s0", "full", minus, "problems with a '-'"),
        ("rlaar_full_s0", "sft_full_s0", "full", None, "all problems"),
        ("rlaar_full_s0", "sft_full_s0", "multi", None, "all problems"),
        ("rlsta_full_s0", "rlsta_nv_full_s0", "multi", None, "all problems"),
        ("rlsta_full_s0", "rlsta_nv_full_s0", "avg", None, "all problems"),
    ]:
        x, y = sc[a][kind], sc[b][kind]
        if keep is not None:
            x, y = _subset(x, keep.__contains__), _subset(y, keep.__contains__)
        out[f"{b} - {a} {kind} on {name}"] = _diff(A.bootstrap_paired(x, y))
    for m in ("rlaar_full_s0", "base_abstain", "sft_full_s0", "base"):
        out[f"{m} FULL on problems with a '-'"] = _pct(A.bootstrap_mean(_subset(sc[m]["full"], minus.__contains__)))
        out[f"{m} FULL on all-'+' problems"] = _pct(A.bootstrap_mean(_subset(sc[m]["full"], plus.__contains__)))
    echo = {m: {k: A.final_reply_lengths(recs[m], k)["echo"] for k in ("sharded", "mt_refine")} for m in recs}
    for m in ("base", "rlsta_nv_full_s0", "grpo_s0", "grpo_full_s0"):
        for k in ("sharded", "mt_refine"):
            out[f"{m} echo {k}"] = _pct(A.bootstrap_mean(echo[m][k]))
    for k in ("sharded", "mt_refine"):
        diff = A.bootstrap_paired(echo["base"][k], echo["rlsta_nv_full_s0"][k])
        out[f"rlsta_nv_full_s0 - base echo {k}"] = _diff(diff)
    out["rlaar_full_s0 training"] = rlaar_training(report / "runs" / "rlaar_full_s0" / "metrics.jsonl")
    for m in ("rlsta_full_s0", "rlsta_nv_full_s0", "rlsta_full_s1"):  # point 2
        out[f"{m} multi-turn"] = _pct(A.bootstrap_mean(sc[m]["multi"]))
    for m in ("icpo_full_s0", "rlaar_full_s0"):  # point 5: the share of last replies the budget cut
        cut = [100 * sum(c.values()) / len(c) for c in
               (A.final_reply_lengths(recs[m], k)["cut"] for k in ("full", "sharded", "mt_refine"))]
        out[f"{m} cut FULL / MT-Add / MT-Refine"] = " / ".join(f"{c:.1f}%" for c in cut)
    legacy = {m: _legacy_kind_scores(recs[m]) for m in ("rlaar_full_s0", "sft_full_s0")}  # point 6 before the fix
    out["sft_full_s0 - rlaar_full_s0 full on all problems, before the extractor fix"] = _diff(
        A.bootstrap_paired(legacy["rlaar_full_s0"]["full"], legacy["sft_full_s0"]["full"]))
    reply = next(r for r in recs["rlsta_full_s1"] if r["task_id"] == "family/heldout/1/0/91/parking"
                 and r["kind"] == "full")["turns"][-1]["assistant"]  # point 7
    out["family/heldout/1/0/91/parking|full|0 of rlsta_full_s1 (gold 15), before / after the fix"] = (
        f"{legacy_value(reply):g} / {extract_answer(reply)}")
    out["extractor fix"] = _extractor_fix(report)
    return out


def main(argv: list[str] | None = None) -> int:
    """Prints the audit's numbers (one per line) and writes them to ``--out`` when given."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", default=str(REPORT), help="the report folder (models/, runs/)")
    ap.add_argument("--out", default=None, help="write the numbers here as JSON")
    a = ap.parse_args(argv)
    out = audit(Path(a.report))
    for k, v in out.items():
        print(f"{k}: {v}")
    if a.out:
        write_json(a.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

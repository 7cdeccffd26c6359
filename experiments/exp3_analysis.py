"""Experiment 3's numbers beside Table 1 (docs/results/experiment3_plan.md, section 5), from committed files.

    python -m experiments.exp3_analysis [--report docs/results/exp3/report] [--out docs/results/exp3/analysis]

Reads the held-out problems, the comparison's greedy transcripts (``<report>/models/<model>/greedy``)
and RLAAR's training metrics (``docs/results/exp3/runs/<arm>/metrics.jsonl``); writes
``analysis.json`` and ``analysis.md``:

- the shortcut rows: each rule's strict accuracy on the held-out problems (``exp2_audit``'s rules:
  add every number, the last, the first, the largest; echo the FULL prompt or MT-Add's last user
  message, as the stage-0 model's conversations sent it);
- per operation (problems with that operation among their steps) and per step count, each model's
  strict accuracy for FULL, MT-Add and MT-Refine;
- echo rates under two rules, each model's MT-Add and MT-Refine last replies, paired against the
  stage-0 model (``base``) and the original model: ``restates`` (the reply only restates the last user
  message: ``analysis.restates_user``) and ``answer`` (the reply's strict answer is a number of the
  last user message; never the gold: no held-out answer is among its problem's numbers);
- RLAAR's training: the steps whose unsolvable samples got an abstention reward (the plan asks for
  it; if none, the report says so).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments import analysis as A
from experiments.common import load_records, write_json
from experiments.exp2_audit import rlaar_training as audit_rlaar_training
from experiments.exp2_audit import shortcut_scores
from experiments.report import kind_scores
from jaxrl_mt.rewards.verifier import extract_answer, find_numbers, parse_number

__all__ = ["answer_echo", "breakdown", "echo_rates", "main", "rlaar_training", "shortcuts"]

HELDOUT = Path("docs/results/exp3/data/heldout.jsonl")
REPORT = Path("docs/results/exp3/report")
RUNS = Path("docs/results/exp3/runs")
KINDS = ("full", "sharded", "mt_refine")
MULTI = ("sharded", "mt_refine")
OPS = ("+", "-", "*", "/")


def answer_echo(user: str, reply: str) -> bool:
    """Whether the reply's strict answer is one of the numbers of the user's message."""
    value = parse_number(extract_answer(reply))
    return value is not None and any(math.isclose(value, n, rel_tol=1e-9, abs_tol=1e-12) for n in find_numbers(user))


def shortcuts(problems: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rule -> bootstrap mean of its strict accuracy on ``problems`` (``base``: the stage-0 model's records,
    whose MT-Add conversations give the last user message the ``echo_mt_add`` rule reads)."""
    last_users = {r["task_id"]: r["turns"][-1]["user"] for r in base if r["kind"] == "sharded"}
    return {rule: A.bootstrap_mean(sc) for rule, sc in shortcut_scores(list(problems), last_users).items()}


def _groups(problems: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Group name -> task ids: ``op +`` (problems with a '+' step), ..., ``steps 1`` .. ``steps 3``."""
    out: dict[str, set[str]] = {}
    for p in problems:
        ops = p["metadata"]["synthetic_ops"]
        for op in OPS:
            if op in ops:
                out.setdefault(f"op {op}", set()).add(p["task_id"])
        out.setdefault(f"steps {len(ops)}", set()).add(p["task_id"])
    return dict(sorted(out.items()))


def breakdown(records: Mapping[str, Sequence[Mapping[str, Any]]],
              problems: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Model -> group (``_groups``) -> kind -> bootstrap mean of the strict last-reply accuracy."""
    groups = _groups(problems)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for m, recs in records.items():
        sc = kind_scores(list(recs), "strict")
        out[m] = {g: {k: A.bootstrap_mean({t: v for t, v in sc[k].items() if t in ids}) for k in KINDS if sc[k]}
                  for g, ids in groups.items()}
    return out


def _echo_scores(recs: Sequence[Mapping[str, Any]], kind: str) -> dict[str, dict[str, float]]:
    """Rule -> task -> 0/1 (mean over runs) for the last replies of ``kind``."""
    per: dict[str, dict[str, list[float]]] = {"restates": {}, "answer": {}}
    for r in recs:
        if r["kind"] != kind:
            continue
        last = r["turns"][-1]
        user, reply = last.get("user") or "", last.get("assistant") or ""
        per["restates"].setdefault(r["task_id"], []).append(float(A.restates_user(user, reply)))
        per["answer"].setdefault(r["task_id"], []).append(float(answer_echo(user, reply)))
    return {rule: {t: sum(v) / len(v) for t, v in d.items()} for rule, d in per.items()}


def echo_rates(records: Mapping[str, Sequence[Mapping[str, Any]]],
               against: Sequence[str] = ("base", "original")) -> dict[str, Any]:
    """Model -> kind -> rule -> {"rate": bootstrap mean, "minus <ref>": paired difference for each ref}."""
    scores = {m: {k: _echo_scores(recs, k) for k in MULTI} for m, recs in records.items()}
    out: dict[str, Any] = {}
    for m, by_kind in scores.items():
        out[m] = {}
        for k, by_rule in by_kind.items():
            out[m][k] = {}
            for rule, sc in by_rule.items():
                cell: dict[str, Any] = {"rate": A.bootstrap_mean(sc)}
                for ref in against:
                    if ref != m and ref in scores:
                        cell[f"minus {ref}"] = A.bootstrap_paired(scores[ref][k][rule], sc)
                out[m][k][rule] = cell
    return out


def rlaar_training(metrics: Path) -> dict[str, Any]:
    """RLAAR's training steps (``exp2_audit.rlaar_training``: how many had unsolvable samples, how many
    rewarded an abstention on them) and the mean over steps of that reward."""
    steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("kind") == "train"]
    mean = sum(r.get("reward/unsolvable_abstain", 0.0) for r in steps) / max(len(steps), 1)
    return {**audit_rlaar_training(metrics), "mean_unsolvable_abstain": mean}


def analyse(report: Path = REPORT, heldout: Path = HELDOUT, runs: Path = RUNS) -> dict[str, Any]:
    """Every number of ``analysis.json`` (the module docstring)."""
    problems = [json.loads(x) for x in heldout.read_text().splitlines() if x.strip()]
    models = sorted(p.parent.name for p in (report / "models").glob("*/greedy") if p.is_dir())
    records = {m: load_records(report / "models" / m / "greedy") for m in models}
    records = {m: r for m, r in records.items() if r}
    ordered = {m: records[m] for m in (*(x for x in ("base", "original") if x in records),
                                       *(x for x in records if x not in ("base", "original")))}
    return {"problems": len(problems), "shortcuts": shortcuts(problems, records.get("base", [])),
            "breakdown": breakdown(ordered, problems), "echo": echo_rates(ordered),
            "rlaar": {p.parent.name: rlaar_training(p) for p in sorted(runs.glob("rlaar_s*/metrics.jsonl"))}}


def _pct(d: Mapping[str, float]) -> str:
    if not d.get("n"):
        return "-"
    return f"{100 * d['mean']:.1f} [{100 * d['lo']:.1f}, {100 * d['hi']:.1f}]"


def _diff(d: Mapping[str, float]) -> str:
    return f"{100 * d['diff']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


def markdown(d: Mapping[str, Any]) -> str:
    """``analysis.md``: the shortcut rows, the breakdowns, the echo rates and RLAAR's abstention in training."""
    lines = [f"# Experiment 3: shortcut rows, breakdowns, echo (held-out, {d['problems']} problems)", "",
             "Recomputed by `python -m experiments.exp3_analysis` from the committed files. Strict verifier, "
             "greedy, last reply; 95% bootstrap CIs over problems.", "",
             "## Shortcut rules (an answer to every FULL prompt; echo: the last user message as the reply)", "",
             "| rule | strict accuracy |", "|---|---:|"]
    lines += [f"| {rule} | {_pct(v)} |" for rule, v in d["shortcuts"].items()]
    groups = list(next(iter(d["breakdown"].values()), {}))
    for kind in KINDS:
        lines += ["", f"## Per operation and step count: {kind}", "",
                  "| model | " + " | ".join(f"{g} (n = {next(iter(d['breakdown'].values()))[g][kind]['n']})"
                                           for g in groups) + " |", "|---|" + "---:|" * len(groups)]
        lines += [f"| {m} | " + " | ".join(_pct(b[g].get(kind, {})) for g in groups) + " |"
                  for m, b in d["breakdown"].items()]
    lines += ["", "## Echo rates of the last replies", "",
              "restates: the reply only restates the last user message; answer: its answer is a number of that "
              "message. Paired differences against the stage-0 model (base) and the original model.", "",
              "| model | kind | restates | - base | - original | answer | - base | - original |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for m, by_kind in d["echo"].items():
        for k, by_rule in by_kind.items():
            cells = []
            for rule in ("restates", "answer"):
                c = by_rule[rule]
                cells += [_pct(c["rate"]), *(_diff(c[f"minus {r}"]) if f"minus {r}" in c else "-"
                                             for r in ("base", "original"))]
            lines.append(f"| {m} | {k} | " + " | ".join(cells) + " |")
    if d["rlaar"]:
        lines += ["", "## RLAAR in training: abstention rewarded on unsolvable samples", "",
                  "| arm | steps | steps with unsolvable samples | steps rewarding an abstention | mean reward |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {a} | {r['steps']} | {r['steps_with_unsolvable']} | {r['steps_unsolvable_abstain_above_0']} | "
                  f"{r['mean_unsolvable_abstain']:.3f} |" for a, r in d["rlaar"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", default=str(REPORT), help="the comparison's folder (models/<name>/greedy)")
    ap.add_argument("--heldout", default=str(HELDOUT))
    ap.add_argument("--runs", default=str(RUNS), help="the arms' committed small files")
    ap.add_argument("--out", default="docs/results/exp3/analysis", help="writes OUT.json and OUT.md")
    a = ap.parse_args(argv)
    d = analyse(Path(a.report), Path(a.heldout), Path(a.runs))
    out = Path(a.out)
    write_json(out.with_suffix(".json"), d)
    out.with_suffix(".md").write_text(markdown(d), encoding="utf-8")
    print(markdown(d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

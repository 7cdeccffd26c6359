"""Calibration: single-turn (FULL) vs multi-turn (MT-Add, MT-Refine) strict accuracy of problem families.

    python -m jaxrl_mt.experiments.calibrate --out /tmp/calib \\
        --families train1=family:train:48:1,heldout1=family:heldout:48:1 --temps 0,1 --max-new-tokens 64

Each family is a LABEL=SOURCE_SPEC pair (``jaxrl_mt.data.load_source``). For every temperature the
base model answers FULL, SHARDED (MT-Add) and MT-Refine conversations of every problem through
``jaxrl_mt.evaluate`` (``final_turn`` protocol, one run per problem and scenario), into
``OUT/T<temp>/``; the accuracy of each family and scenario is the strict (and lenient) verifier on
the last reply, recomputed from the transcripts. Writes ``OUT/calibration.json`` and
``OUT/calibration.md``; ``--recompute`` rebuilds both from the transcripts alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from jaxrl_mt.experiments.analysis import bootstrap_mean, last_reply_scores
from jaxrl_mt.experiments.common import eval_config, load_records, write_json

SCENARIOS = ("full", "sharded", "mt_refine")


def parse_families(text: str) -> dict[str, str]:
    """``"a=spec1,b=spec2"`` -> ``{"a": "spec1", "b": "spec2"}`` (specs may hold ':' but not ',')."""
    out = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        label, sep, spec = part.partition("=")
        if not sep or not label or not spec:
            raise SystemExit(f"--families: expected LABEL=SOURCE_SPEC, got {part!r}")
        out[label] = spec
    return out


def summarize(out: Path, families: dict[str, str], temps: list[float]) -> dict[str, Any]:
    """Per temperature, family and scenario: strict and lenient accuracy of the last reply."""
    from jaxrl_mt.data.loaders import load_source

    ids = {label: {t.task_id for t in load_source(spec)} for label, spec in families.items()}
    table: dict[str, Any] = {}
    for temp in temps:
        recs = load_records(out / f"T{temp:g}")
        for label, tids in ids.items():
            row = {}
            for kind in SCENARIOS:
                for mode in ("strict", "lenient"):
                    s = last_reply_scores(recs, kind, mode, keep=tids.__contains__)
                    row[f"{kind}_{mode}"] = bootstrap_mean(s) if s else None
            table[f"T{temp:g}/{label}"] = row
    return {"families": families, "temps": temps, "table": table}


def markdown(summary: dict[str, Any], command: str) -> str:
    """The calibration table (strict accuracy, lenient in parentheses, n problems)."""
    def cell(x: Any, y: Any) -> str:
        return "-" if x is None else f"{100 * x['mean']:.0f} ({100 * y['mean']:.0f})"

    lines = ["| T | family | n | FULL | MT-Add | MT-Refine | MT-Add / FULL |", "|---|---|---:|---:|---:|---:|---:|"]
    for key, row in summary["table"].items():
        temp, label = key.split("/", 1)
        f, a = row["full_strict"], row["sharded_strict"]
        ratio = "-" if not f or not a or f["mean"] == 0 else f"{a['mean'] / f['mean']:.2f}"
        lines.append(f"| {temp[1:]} | {label} | {f['n'] if f else 0} | {cell(f, row['full_lenient'])} | "
                     f"{cell(a, row['sharded_lenient'])} | {cell(row['mt_refine_strict'], row['mt_refine_lenient'])} "
                     f"| {ratio} |")
    src = ", ".join(f"`{k}` = `{v}`" for k, v in summary["families"].items())
    return "\n".join(["Strict accuracy of the last reply in % (lenient in parentheses).", "", *lines, "",
                      f"Families: {src}.", "", f"Command: `{command}`", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--families", default="train1=family:train:48:1,heldout1=family:heldout:48:1")
    ap.add_argument("--temps", default="0,1", help="comma-separated sampling temperatures")
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--system", default="", help="system prompt ('' = the template's default)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--recompute", action="store_true", help="only rebuild the summary from the transcripts")
    a = ap.parse_args(argv)
    out = Path(a.out)
    families = parse_families(a.families)
    temps = [float(t) for t in a.temps.split(",")]
    if not a.recompute:
        from jaxrl_mt.evaluate import evaluate, load_eval_model

        model = load_eval_model(a.model)
        for temp in temps:
            cfg = eval_config(model=a.model, dataset=tuple(families.values()), limit=0, scenarios=a.scenarios,
                              runs=1, temperature=temp, max_new_tokens=a.max_new_tokens, protocol="final_turn",
                              system_prompt=a.system, max_batch=a.max_batch, workdir=str(out / f"T{temp:g}"),
                              plots=False, bootstrap=200, reuse_cache=False)  # caches of all rows: GBs
            evaluate(cfg, model=model)
    summary = summarize(out, families, temps)
    summary["settings"] = {"model": a.model, "max_new_tokens": a.max_new_tokens, "system": a.system}
    write_json(out / "calibration.json", summary)
    md = markdown(summary, "python -m jaxrl_mt.experiments.calibrate " + " ".join(
        f"'{x}'" if " " in x else x for x in (argv if argv is not None else sys.argv[1:])))
    (out / "calibration.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

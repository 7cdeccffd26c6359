"""The comparison's reply budget and system prompt (issue 35), chosen by the rule fixed before any run.

    python -m experiments.budget --out docs/results/exp2/budget [--recompute]

The rule (``docs/results/experiment2_plan.md``): the base model answers the FULL prompt of
training-family problems only (``FAMILIES``; the held-out problems play no part), greedily, with
a ``CEILING``-token budget, once per candidate system prompt (``PROMPTS``). The share a budget B
would cut is the share of replies of at least B tokens (exact for greedy decoding: a reply's first
B tokens do not depend on the budget). Per prompt, the smallest candidate budget (``BUDGETS``) at
which at most ``LIMIT`` of the replies reach it; the chosen pair has the smallest such budget, a
tie going to the higher FULL strict accuracy at the ceiling (then to the earlier prompt). If no
prompt gets under the limit at the largest budget, the pair with the smallest cut share at 128
tokens is chosen and flagged (``fallback``: the report must then give accuracy on uncut replies).

Each prompt's conversations go through ``experiments.calibrate`` into ``OUT/<prompt>/T0/``
(transcripts gzipped, so they can be committed); a prompt whose transcripts exist is not run
again. Writes ``OUT/budget.json`` and ``OUT/budget.md``; ``--recompute`` rebuilds both from the
transcripts alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from experiments.analysis import bootstrap_mean, last_reply_scores
from experiments.calibrate import cut_shares
from experiments.common import compress_transcripts, evaluation_finished, load_records, write_json

__all__ = ["BUDGETS", "CEILING", "FAMILIES", "LIMIT", "PROMPTS", "choose", "main", "summarize"]

PROMPTS = {
    "S0": "",  # the chat template's default
    "S1": "Answer with one short sentence that ends with the final number.",
    "S2": "You are a helpful assistant. Solve the problem briefly, in at most three short sentences, and end "
          "with: The answer is N.",
    "S3": "Solve the math problem in one short line, like this example.\nQuestion: Mia has 12 cards. She loses "
          "4 cards. How many cards does Mia have now?\nAnswer: 12 - 4 = 8. The answer is 8.",
}
BUDGETS = (64, 96, 128, 192)
CEILING = 256
LIMIT = 0.10
FALLBACK_BUDGET = 128
FAMILIES = "train1=family:train:32:1,train2=family:train:16:2"


def choose(rows: dict[str, dict[str, Any]], budgets: tuple[int, ...] = BUDGETS, limit: float = LIMIT
           ) -> dict[str, Any]:
    """The rule on per-prompt summaries.

    Args:
      rows: prompt name (in preference order for a full tie) -> ``{"cut_at": {str(B): share of
        replies of >= B tokens}, "full_strict": accuracy at the ceiling}``.
      budgets: candidate budgets, ascending; limit: the largest cut share allowed.

    Returns:
      ``{"prompt", "budget", "fallback", "smallest_budget": {prompt: B or None}}``.
    """
    smallest = {p: next((b for b in budgets if r["cut_at"][str(b)] <= limit), None) for p, r in rows.items()}
    ok = [p for p, b in smallest.items() if b is not None]
    if ok:
        order = list(rows)
        best = min(ok, key=lambda p: (smallest[p], -rows[p]["full_strict"], order.index(p)))
        return {"prompt": best, "budget": smallest[best], "fallback": False, "smallest_budget": smallest}
    key = str(FALLBACK_BUDGET)
    best = min(rows, key=lambda p: (rows[p]["cut_at"][key], -rows[p]["full_strict"], list(rows).index(p)))
    return {"prompt": best, "budget": FALLBACK_BUDGET, "fallback": True, "smallest_budget": smallest}


def summarize(out: Path, prompts: dict[str, str] = PROMPTS) -> dict[str, Any]:
    """Per prompt (those with transcripts): reply count, cut shares, FULL strict accuracy with CI; and the choice."""
    rows: dict[str, dict[str, Any]] = {}
    for name in prompts:
        folder = out / name / "T0"
        if not (folder / "transcripts.jsonl.gz").is_file() and not (folder / "transcripts.jsonl").is_file():
            continue
        recs = load_records(folder)
        cuts = cut_shares(recs, "full", lambda _t: True, list(BUDGETS))
        acc = bootstrap_mean(last_reply_scores(recs, "full", "strict"), n_boot=1000, seed=0)
        rows[name] = {"system": prompts[name], "n": cuts["n"], "median_tokens": cuts["median_tokens"],
                      "cut_at_ceiling": cuts["cut"], "cut_at": cuts["cut_at"], "full_strict": acc["mean"],
                      "full_strict_ci": [acc["lo"], acc["hi"]]}
    return {"families": FAMILIES, "ceiling": CEILING, "budgets": list(BUDGETS), "limit": LIMIT, "rows": rows,
            "choice": choose(rows) if rows else None}


def markdown(s: dict[str, Any]) -> str:
    """The table of cut shares per prompt and budget, and the choice."""
    lines = [f"Base model, greedy FULL replies to training-family problems (`{s['families']}`), "
             f"{s['ceiling']}-token budget. Share of replies of at least B tokens (what budget B cuts), in %; "
             f"FULL strict accuracy at {s['ceiling']} tokens with its 95% bootstrap CI.", "",
             "| prompt | n | median tokens | " + " | ".join(f"≥ {b}" for b in s["budgets"])
             + f" | cut at {s['ceiling']} | FULL strict | smallest B ≤ {100 * s['limit']:.0f}% |",
             "|---|---:|---:|" + "---:|" * len(s["budgets"]) + "---:|---:|---|"]
    for name, r in s["rows"].items():
        sb = (s["choice"] or {}).get("smallest_budget", {}).get(name)
        lines.append(f"| {name} | {r['n']} | {r['median_tokens']:.0f} | "
                     + " | ".join(f"{100 * r['cut_at'][str(b)]:.1f}" for b in s["budgets"])
                     + f" | {100 * r['cut_at_ceiling']:.1f} | {100 * r['full_strict']:.1f} "
                       f"[{100 * r['full_strict_ci'][0]:.1f}, {100 * r['full_strict_ci'][1]:.1f}] | {sb or 'none'} |")
    c = s["choice"]
    lines += ["", "Prompts: " + "; ".join(f"{k} = {v!r}" for k, v in ((n, r["system"]) for n, r in s["rows"].items())),
              ""]
    if c:
        how = ("no prompt reaches the limit at the largest budget: fallback to the smallest cut share at "
               f"{FALLBACK_BUDGET} tokens (report accuracy on uncut replies too)") if c["fallback"] else "the rule"
        lines.append(f"**Chosen: {c['prompt']} at {c['budget']} tokens** ({how}).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/results/exp2/budget")
    ap.add_argument("--prompts", default=",".join(PROMPTS), help="which candidate prompts to run (names)")
    ap.add_argument("--max-batch", type=int, default=48)
    ap.add_argument("--recompute", action="store_true", help="only rebuild budget.{json,md} from the transcripts")
    a = ap.parse_args(argv)
    out = Path(a.out)
    names = [n.strip() for n in a.prompts.split(",") if n.strip()]
    unknown = sorted(set(names) - set(PROMPTS))
    if unknown:
        raise SystemExit(f"--prompts: unknown {unknown}; expected names among {sorted(PROMPTS)}")
    if not a.recompute:
        from experiments import calibrate

        for name in names:
            folder = out / name
            if evaluation_finished(folder / "T0"):  # compressed by an earlier invocation
                continue
            calibrate.main(["--out", str(folder), "--families", FAMILIES, "--temps", "0", "--scenarios", "full",
                            "--max-new-tokens", str(CEILING), "--system", PROMPTS[name], "--max-batch",
                            str(a.max_batch), "--budgets", ",".join(map(str, BUDGETS))])
            compress_transcripts(folder / "T0")
    s = summarize(out)
    write_json(out / "budget.json", s)
    (out / "budget.md").write_text(markdown(s), encoding="utf-8")
    print(markdown(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())

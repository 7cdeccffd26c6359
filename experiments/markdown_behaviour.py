"""The report's behaviour section: contextual inertia, final replies and response types (``experiments.markdown``)."""

from __future__ import annotations

from typing import Any

from experiments.analysis import ECHO_SHARE
from experiments.cells import diff, pct, tokens
from experiments.common import GREEDY_KINDS, KIND_NAMES

__all__ = ["behaviour", "icpo_view"]


def behaviour(report: dict[str, Any]) -> list[str]:
    """Contextual inertia, final replies (length, cut, echo), response types per turn and ICPO's view."""
    out = [
        "## Contextual inertia and response types",
        "",
        "Among conversations whose final answer follows an earlier wrong answer, the share whose final answer "
        "repeats an earlier wrong number (greedy; 95% bootstrap CI over conversations).",
        "",
        "| model | MT-Add | MT-Refine | both | n (both) | final answer right (both) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for n, m in report["models"].items():
        i = m["inertia"]
        right = i["all"]["last_correct_share"]
        out.append(
            f"| {n} | {pct(i['sharded']['ci'])} | {pct(i['mt_refine']['ci'])} | {pct(i['all']['ci'])} | "
            f"{i['all']['n_eligible']} | {'-' if right is None else f'{100 * right:.1f}'} |"
        )
    out += [
        "",
        "Final replies (greedy): mean length in tokens, the share cut by the "
        f"{report['manifest']['max_new_tokens']}-token reply budget (a cut reply's last number is often not its "
        f"answer), and the share that only restates the last user message (echo: no number the message lacks, and "
        f"at least {ECHO_SHARE:.0%} of the reply's words are in it).",
        "",
        "| model | " + " | ".join(f"{KIND_NAMES[k]} tokens | {KIND_NAMES[k]} cut | {KIND_NAMES[k]} echo"
                                 for k in GREEDY_KINDS) + " |",
        "|---|" + "---:|---:|---:|" * len(GREEDY_KINDS),
    ]
    for n, m in report["models"].items():
        fr = m.get("final_reply")
        if fr:
            out.append(f"| {n} | " + " | ".join(
                f"{tokens(fr[k]['tokens'])} | {pct(fr[k]['cut'])} | {pct(fr[k]['echo'])}"
                for k in GREEDY_KINDS) + " |")
    out += [
        "",
        "Response types per turn (judge labels, MT-Add, greedy) and the turn of the first answer attempt:",
        "",
        "| model | turn | labels | first answer turn: mean (MT-Add) | never answered |",
        "|---|---:|---|---:|---:|",
    ]
    for n, m in report["models"].items():
        fa = m["first_answer_turn"].get("sharded") or {"mean": None, "frac_never": float("nan")}
        for t, c in m["response_types"]["sharded"].items():
            labs = ", ".join(f"{k} {v}" for k, v in c.items())
            mean = "-" if fa["mean"] is None else f"{fa['mean']:.2f}"
            out.append(f"| {n} | {t} | {labs} | {mean} | {fa['frac_never']:.2f} |")
    icpo = icpo_view(report)
    return out + ([""] + icpo if icpo else [])


def icpo_view(report: dict[str, Any]) -> list[str]:
    """MT-Add's turns before the last: the non-answer and answer-attempt shares per model, the difference
    in the non-answer share against the paired models (``report["pairs"]``), and the first answer turn."""
    if not any((m.get("early_turns") or {}).get("non_answer", {}).get("n") for m in report["models"].values()):
        return []
    out = ["ICPO's view: on MT-Add's turns before the last (not every condition given yet), the share of replies "
           "that do not commit to an answer (clarification, interrogation, discussion, hedging or refusal) and "
           "the share of answer attempts (judge labels, greedy; mean over problems, 95% bootstrap CI); the last "
           "turn's accuracy is MT-Add's.", "",
           "| model | non-answer | answer attempt | first answer turn (mean) | never answered | MT-Add |",
           "|---|---:|---:|---:|---:|---:|"]
    for n, m in report["models"].items():
        e, fa = m.get("early_turns") or {}, m["first_answer_turn"].get("sharded") or {}
        mean = "-" if fa.get("mean") is None else f"{fa['mean']:.2f}"
        never = "-" if fa.get("frac_never") is None else f"{fa['frac_never']:.2f}"
        out.append(f"| {n} | {pct(e.get('non_answer'))} | {pct(e.get('answer'))} | {mean} | {never} | "
                   f"{pct(m['strict']['sharded'])} |")
    pairs = [(k, p["early_non_answer"]) for k, p in report.get("pairs", {}).items() if "early_non_answer" in p]
    if pairs:
        out += ["", "Difference in that non-answer share (percentage points, paired by problem; * = excludes 0): "
                + "; ".join(f"{k} {diff(c)}" for k, c in pairs) + "."]
    return out

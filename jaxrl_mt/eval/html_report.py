"""``report.html``: one self-contained page to read an evaluation (no network at view time).

The page holds the metrics table with its bootstrap confidence intervals and the PNG plots
(base64 ``data:`` images), both as static HTML, and a conversation browser: every transcript
record embedded as JSON and rendered by plain JavaScript (the template is
``jaxrl_mt/assets/report/report.html``), filtered by scenario, task, score and text. Each turn
shows the user text, the reply, the judge's label, the extracted answer and the verifier's
verdict. Filters live in the URL fragment (``report.html#scenario=sharded&score=0``), so a
filtered view can be linked; ``open=first`` / ``open=all`` expands conversations.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PLOT_CAPTIONS", "TEMPLATE", "html_report", "write_html_report"]

TEMPLATE = Path(__file__).resolve().parent.parent / "assets" / "report" / "report.html"
PLOT_CAPTIONS = {"p_by_scenario.png": "Performance P by scenario, with bootstrap confidence intervals",
                 "aptitude_unreliability.png": "Aptitude A90 against unreliability U90-10",
                 "first_answer_turn.png": "Turn of the first answer attempt"}
METRIC_COLUMNS = (("P", "P"), ("A90", "A90"), ("U90_10", "U90-10"))


def _fmt(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _metrics_table(report: Mapping[str, Any]) -> str:
    """The metrics table: one row per scenario, each metric with its CI."""
    level = int(round(100 * report.get("ci_level", 0.95)))
    head = ["scenario", "instructions", "runs"] + [f"{name} [{level}% CI]" for _, name in METRIC_COLUMNS] + [
        "P / P(FULL)", "first answer turn (mean)", "never answered"]
    rows = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for kind, s in report.get("scenarios", {}).items():
        cells = [html.escape(kind), str(s["n_instructions"]), str(s["n_runs"])]
        for key, _ in METRIC_COLUMNS:
            lo, hi = s["ci"][key]
            cells.append(f"{_fmt(s[key])} <span class=\"ci\">[{_fmt(lo)}, {_fmt(hi)}]</span>")
        fa = s["first_answer_turn"]
        cells += [_fmt(s.get("ratio_to_full"), 2), _fmt(fa.get("mean"), 2), _fmt(fa.get("frac_never"), 2)]
        rows.append(f"<tr data-scenario=\"{html.escape(kind)}\">" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "<table class=\"metrics\" id=\"metrics\">\n" + "\n".join(rows) + "\n</table>"


def _plots(plots: Sequence[str | Path]) -> str:
    figures = []
    for p in plots:
        path = Path(p)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        caption = html.escape(PLOT_CAPTIONS.get(path.name, path.stem))
        figures.append(f"<figure><img alt=\"{caption}\" src=\"data:image/png;base64,{data}\">"
                       f"<figcaption>{caption}</figcaption></figure>")
    return "<div class=\"plots\">" + "".join(figures) + "</div>" if figures else ""


def _json_for_script(obj: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</``, no HTML comment openers)."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def html_report(report: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                plots: Sequence[str | Path] = ()) -> str:
    """The page as a string.

    Args:
      report: ``build_report``'s report.
      records: the transcript records it was built from.
      plots: PNG files to inline.
    """
    title = f"LiC evaluation ({report.get('protocol', '?')} protocol)"
    meta = [f"{report.get('n_conversations', len(records))} conversations"]
    if report.get("model"):
        meta.insert(0, f"model <code>{html.escape(str(report['model']))}</code>")
    body = [f"<h1>{html.escape(title)}</h1>", f"<div class=\"meta\">{' · '.join(meta)}</div>",
            "<h2>Metrics</h2>", _metrics_table(report)]
    if report.get("missing_scenarios"):
        missing = html.escape(", ".join(report["missing_scenarios"]))
        body.append(f"<p class=\"note\">No conversations for: {missing}.</p>")
    body.append(f"<p class=\"note\">{html.escape(str(report.get('metrics_note', '')))} Confidence intervals: "
                f"percentile bootstrap over instructions, {report.get('n_bootstrap', '?')} replicates.</p>")
    figures = _plots(plots)
    if figures:
        body += ["<h2>Plots</h2>", figures]
    data = {"scenarios": list(report.get("scenarios", {})) + list(report.get("missing_scenarios", [])),
            "records": sorted(records, key=lambda r: (str(r["kind"]), str(r["task_id"]), r["run"]))}
    values = {"TITLE": html.escape(title), "BODY": "\n".join(body), "DATA": _json_for_script(data)}
    return re.sub(r"__(TITLE|BODY|DATA)__", lambda m: values[m.group(1)], TEMPLATE.read_text(encoding="utf-8"))


def write_html_report(report: Mapping[str, Any], records: Sequence[Mapping[str, Any]], out_dir: str | Path,
                      plots: Sequence[str | Path] = ()) -> Path:
    """Writes ``report.html`` into ``out_dir``; returns its path."""
    path = Path(out_dir) / "report.html"
    path.write_text(html_report(report, records, plots), encoding="utf-8")
    return path

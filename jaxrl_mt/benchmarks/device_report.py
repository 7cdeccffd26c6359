"""The device check's summary and markdown report (`benchmarks.device_check`), from its JSON record alone."""

from __future__ import annotations

from typing import Any

TRAIN_KEYS = ("perf/step_s", "perf/rollout_s", "perf/anchor_s", "perf/reference_s", "perf/update_s",
              "perf/update_mfu", "perf/update_tflops", "perf/rollout_tokens_per_s", "perf/update_tokens_per_s",
              "perf/peak_memory_gib", "rollout_share")


def _result(record: dict[str, Any], part: str) -> dict[str, Any]:
    return record.get("parts", {}).get(part, {}).get("result") or {}


def _largest_row(rows: list[dict[str, Any]], phase: str) -> dict[str, Any] | None:
    """The measured `phase` entry of the largest batch that ran (not skipped)."""
    ran = [r for r in rows if phase in r and "skipped" not in r[phase]]
    return max(ran, key=lambda r: r["batch"]) if ran else None


def _accel_summary(res: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for shape in res.get("shapes", []):
        for phase, keys in (("decode", ("tokens_per_s", "roofline_fraction")),
                            ("score", ("tokens_per_s", "mfu")), ("train", ("tokens_per_s", "mfu"))):
            row = _largest_row(shape["rows"], phase)
            if row is not None:
                out[f"{shape['name']}/{phase}"] = {"batch": row["batch"], **{k: row[phase].get(k) for k in keys}}
    return out


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """The check's headline numbers: which parts passed, accel's largest batches, the trainer's steady
    step, the evaluation's throughput and the parity verdicts."""
    parts = record.get("parts", {})
    out: dict[str, Any] = {"parts_ok": {p: bool(v.get("ok")) for p, v in parts.items()}}
    dev = _result(record, "device")
    out["device_kind"], out["platform"] = dev.get("device_kind"), dev.get("platform")
    out["accel"] = _accel_summary(_result(record, "accel"))
    train = _result(record, "train")
    steps = train.get("steps", [])
    out["train"] = {k: train.get("steady", {}).get(k) for k in TRAIN_KEYS}
    out["train"]["steps"] = len(steps)
    out["train"]["first_step_compile_s"] = steps[0].get("perf/compile_s") if steps else None
    lic = _result(record, "lic")
    out["lic"] = {k: lic.get(k) for k in ("conversations", "conversations_per_s", "tokens_per_s")}
    mem = _result(record, "memory").get("record")
    if mem:
        out["memory"] = {"model": mem["model"], "backend": mem["backend"], "remat": mem["remat"],
                         "step_peak_gib": mem["step_peak"] / 2 ** 30, "at": mem["step_peak_program"],
                         "programs_gib": {k: v["peak"] / 2 ** 30 for k, v in mem["programs"].items()}}
    par = _result(record, "parity").get("dtypes", {})
    out["parity"] = {d: {k: v.get(k) for k in ("tokens_equal", "all_tokens_equal", "logprob_max_abs_diff",
                                                "logprobs_within_tol")} for d, v in par.items()}
    return out


def _f(x: Any, fmt: str = "{:.3g}") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    return fmt.format(x) if isinstance(x, (int, float)) else str(x)


def _parts_table(record: dict[str, Any]) -> list[str]:
    lines = ["| part | ok | seconds | budget s | note |", "|---|---|---|---|---|"]
    for name, p in record.get("parts", {}).items():
        note = p.get("error", "")
        lines.append(f"| {name} | {_f(bool(p.get('ok')))} | {_f(p.get('seconds'), '{:.1f}')} | "
                     f"{_f(p.get('budget_s'), '{:.0f}')} | {note} |")
    return lines


def _train_lines(s: dict[str, Any]) -> list[str]:
    t = s["train"]
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    return [f"Trainer (`configs/rlsta.py:paper_shapes`, {t['steps']} steps; means of the steps after the first):",
            "", "| step s | rollout s | anchor s | reference s | update s | update MFU | rollout share | "
            "peak memory GiB | step 1 compile s |", "|---|---|---|---|---|---|---|---|---|",
            f"| {_f(t['perf/step_s'])} | {_f(t['perf/rollout_s'])} | {_f(t['perf/anchor_s'])} | "
            f"{_f(t['perf/reference_s'])} | {_f(t['perf/update_s'])} | {pct(t['perf/update_mfu'])} | "
            f"{pct(t['rollout_share'])} | {_f(t['perf/peak_memory_gib'])} | {_f(t['first_step_compile_s'])} |"]


def format_markdown(record: dict[str, Any]) -> str:
    """The report: parts, accel's largest batches, the trainer's phase split, LiC throughput, parity lines."""
    s = record.get("summary") or summary(record)
    lines = [f"# Device check ({record.get('shape')}): {s.get('device_kind') or 'device unknown'}", "",
             f"`{record.get('command', '')}`, {record.get('date', '')}, {_f(record.get('total_s'), '{:.0f}')} s "
             "in all.", ""]
    lines += _parts_table(record) + [""]
    if s["accel"]:
        lines += ["`benchmarks accel` at the largest batch that ran:", "",
                  "| shape / phase | batch | tokens/s | MFU or HBM fraction |", "|---|---|---|---|"]
        for key, v in s["accel"].items():
            frac = v.get("mfu", v.get("roofline_fraction"))
            lines.append(f"| {key} | {v['batch']} | {_f(v['tokens_per_s'], '{:,.0f}')} | {_f(frac)} |")
        lines.append("")
    if s["train"]["steps"]:
        lines += _train_lines(s) + [""]
    if s["lic"].get("conversations") is not None:
        lic = s["lic"]
        lines += [f"LiC evaluation (FULL + SHARDED, greedy): {lic['conversations']} conversations, "
                  f"{_f(lic['conversations_per_s'])} conversations/s, {_f(lic['tokens_per_s'], '{:,.0f}')} "
                  "new tokens/s.", ""]
    if "memory" in s:
        m = s["memory"]
        progs = ", ".join(f"{k} {v:.2f}" for k, v in m["programs_gib"].items())
        lines += [f"Whole RLSTA step compiled by XLA:{str(m['backend']).upper()} ({m['model']}, one device, remat "
                  f"{m['remat']}): step peak {m['step_peak_gib']:.2f} GiB at {m['at']}; program peaks (GiB): {progs}.",
                  ""]
    for dtype, p in s["parity"].items():
        lines.append(f"- parity {dtype}: greedy tokens equal the CPU's on {p['tokens_equal']} of 8 prompts "
                     f"({_f(p['all_tokens_equal'])}); scorer log-probs max |diff| "
                     f"{_f(p['logprob_max_abs_diff'])} ({'within' if p['logprobs_within_tol'] else 'OUTSIDE'} "
                     "tolerance)")
    return "\n".join(lines).rstrip()

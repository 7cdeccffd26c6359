"""The markdown report of the accelerator benchmark (`jaxrl_mt.benchmarks.accel`): one table per model shape."""

from __future__ import annotations

from typing import Any

COLUMNS = (("decode", "tokens_per_s", "decode tok/s"), ("decode", "gb_per_s", "decode GB/s"),
           ("decode", "roofline_fraction", "of HBM roofline"),
           ("score", "tokens_per_s", "score tok/s"), ("score", "tflops", "score TFLOP/s"),
           ("score", "mfu", "score MFU"),
           ("train", "tokens_per_s", "train tok/s"), ("train", "tflops", "train TFLOP/s"),
           ("train", "mfu", "train MFU"))
FRACTIONS = ("roofline_fraction", "mfu")
FORMULAS = """Formulas (`jaxrl_mt/benchmarks/roofline.py`): N = L*(D*(Hq+2*Hkv)*K + Hq*K*D + 3*D*F) + V*D
(matrix-product parameters, LM head included); scoring MFU = B*T*(2*N + 4*L*Hq*K*T) / s / peak, train MFU =
B*T*(6*N + 12*L*Hq*K*T) / s / peak, T = P + N_new; decode bytes/step = weights + 2*L*B*Hkv*K*(P + N_new/2)*bytes
(the K/V cache at the mean attended length), HBM roofline fraction = bytes/step * decode steps/s / peak HBM
bytes/s. Decode tokens/s is the decode loop alone: (call with N_new tokens - call with 1 token), greedy, every
row generating N_new tokens."""


def fmt_number(x: float) -> str:
    """A rate for the table: thousands separators from 100 up, three significant digits below."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def fmt_cell(phase_result: dict[str, Any], key: str) -> str:
    """One cell: "skipped", "n/a" (a fraction with no known peak) or the value."""
    if "skipped" in phase_result:
        return "skipped"
    v = phase_result.get(key)
    if v is None:
        return "n/a"
    return f"{100 * v:.1f}%" if key in FRACTIONS else fmt_number(v)


def peak_line(r: dict[str, Any]) -> str:
    """The peak the fractions are taken against, or why there is none."""
    p = r["peak"]
    if p is None:
        return f"peak unknown for {r['device_kind']}: roofline and MFU fractions are n/a (raw rates still shown)"
    return (f"peak of {p['name']} (`roofline.PEAKS`, vendor data sheet): {p['bf16_tflops']:g} TFLOP/s bf16 dense, "
            f"{p['hbm_gb_s']:g} GB/s HBM")


def shape_table(shape: dict[str, Any], phases: list[str]) -> list[str]:
    """The heading, table and skip notes of one model shape."""
    cols = [c for c in COLUMNS if c[0] in phases]
    cfg = shape["config"]
    lines = [f"## {shape['name']}", "",
             f"{shape['params'] / 1e6:.1f}M parameters ({shape['param_bytes'] / 1e9:.2f} GB), N = "
             f"{shape['matmul_params'] / 1e6:.1f}M in matrix products; L {cfg['num_layers']}, D {cfg['hidden_size']}, "
             f"F {cfg['intermediate_size']}, heads {cfg['num_heads']} (KV {cfg['num_kv_heads']}) x {cfg['head_dim']}, "
             f"V {cfg['vocab_size']}, tied embeddings {str(cfg['tie_word_embeddings']).lower()}.", "",
             "| batch | " + " | ".join(c[2] for c in cols) + " |",
             "|---:|" + "---:|" * len(cols)]
    notes = []
    for row in shape["rows"]:
        lines.append(f"| {row['batch']} | " + " | ".join(fmt_cell(row[p], k) for p, k, _ in cols) + " |")
        notes += [f"- batch {row['batch']} {p}: {row[p]['skipped']}" for p in phases if "skipped" in row[p]]
        if row.get("train", {}).get("finite") is False:
            notes.append(f"- batch {row['batch']} train: non-finite loss or gradient (the step kept the old "
                         "parameters; its timing is shown)")
    if notes:
        lines += ["", "Notes:", *notes]
    return lines


def format_markdown(r: dict[str, Any], command: str = "") -> str:
    """The whole report of a `accel.run` result."""
    lines = [f"# Accelerator benchmark: {r['device_kind']}", ""]
    if command:
        lines += [f"`{command.strip()}`", ""]
    lines += [f"{r['device_kind']} ({r['platform']}, {r['device_count']} device(s), the first one used), "
              f"jax {r['jax_version']}, {r['date']}; {peak_line(r)}.", "",
              f"Random weights in each model's published shape, {r['dtype']} parameters and compute; prompts of "
              f"{r['prompt_len']} random tokens, {r['new_tokens']} new tokens (decode; completion of the train step); "
              f"scoring and train step over {r['prompt_len'] + r['new_tokens']} tokens per row; median of "
              f"{r['repeats']} timed calls after a warm-up call; train step remat {str(r['remat']).lower()}.", ""]
    for shape in r["shapes"]:
        lines += shape_table(shape, r["phases"]) + [""]
    lines.append(FORMULAS)
    return "\n".join(lines)

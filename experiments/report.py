"""The comparison report, computed from the files ``compare`` writes (and nothing else).

Folder layout (``OUT`` = the report's markdown path without ``.md``)::

    OUT/manifest.json                    models (name, spec, run folder), settings, commands
    OUT/models/<name>/greedy/transcripts.jsonl   T = 0, FULL + MT-Add + MT-Refine, one run each
    OUT/models/<name>/lic/transcripts.jsonl      T = 1, FULL + SHARDED, N runs (LiC protocol)
    OUT/models/<name>/{greedy,lic}/code.json     the code version of each invocation that wrote them
    OUT/runs/<name>/{metrics.jsonl, config.json, run_info.json, train_items.jsonl.stats.json, best.json}
    OUT/report.json, OUT/*.png           written by :func:`write`

:func:`build` reads only these files, so ``compare --recompute`` rebuilds the same report. Besides the
accuracies, pairs and LiC metrics, each model holds ``uncut_strict`` (strict accuracy of the greedy
conversations whose last reply the budget did not cut; the cut share is ``final_reply.<kind>.cut``) and
each LiC scenario ``pass@k`` / ``pass^k`` (k = 1..N); with arms of several seeds (``<arm>_s<N>``
models) the report holds ``seeds`` (``experiments.seeds``: two-level bootstrap, mean training curves).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from jaxrl_mt.eval.metrics import first_answer_turn_stats
from jaxrl_mt.eval.report import build_report
from experiments import analysis as A
from experiments.common import CURVE_KEYS, DYNAMICS_KEYS, GREEDY_KINDS, TABLE_KINDS, load_records, write_json
from experiments.provenance import read_evaluation_code
from experiments.seeds import seeds_section

__all__ = ["CURVE_KEYS", "GREEDY_KINDS", "build", "kind_scores", "read_curves", "write"]

RUN_FILES = ("metrics.jsonl", "config.json", "run_info.json", "train_items.jsonl.stats.json", "best.json")


def kind_scores(recs: list[dict], mode: str) -> dict[str, dict[str, float]]:
    """kind -> task -> last-reply score; ``multi`` = the mean of MT-Add and MT-Refine per problem, ``avg``
    the mean of FULL, MT-Add and MT-Refine (problems with all of them)."""
    out = {k: A.last_reply_scores(recs, k, mode) for k in GREEDY_KINDS}
    both = set(out["sharded"]) & set(out["mt_refine"])
    out["multi"] = {t: (out["sharded"][t] + out["mt_refine"][t]) / 2 for t in sorted(both)}
    out["avg"] = {t: (out["full"][t] + out["sharded"][t] + out["mt_refine"][t]) / 3
                  for t in sorted(both & set(out["full"]))}
    return out


def _model_section(recs: list[dict], lic_recs: list[dict] | None, strict: dict[str, dict[str, float]],
                   early: dict[str, dict[str, float]], n_boot: int, seed: int) -> dict[str, Any]:
    """One model's part of the report; ``strict``: its ``kind_scores(recs, "strict")``, ``early``: its
    ``early_turn_shares(recs, "sharded")`` (computed once by ``build``, which pairs them across models)."""
    sec: dict[str, Any] = {"n_conversations": len(recs)}
    for mode in ("strict", "lenient"):
        sc = strict if mode == "strict" else kind_scores(recs, mode)
        sec[mode] = {k: A.bootstrap_mean(v, n_boot=n_boot, seed=seed) for k, v in sc.items()}
        sec[mode]["ratio"] = {
            k: A.bootstrap_ratio(sc[k], sc["full"], n_boot=n_boot, seed=seed) for k in ("sharded", "mt_refine", "multi")
        }
    fams = sorted({A.family_of(r["task_id"]) for r in recs})
    sec["families"] = {
        f: {
            k: A.bootstrap_mean(
                A.last_reply_scores(recs, k, "strict", keep=lambda t, f=f: A.family_of(t) == f),
                n_boot=n_boot,
                seed=seed,
            )
            for k in GREEDY_KINDS
        }
        for f in fams
    }
    inert = {"all": A.inertia(recs, ("sharded", "mt_refine"))}
    inert.update({k: A.inertia(recs, (k,)) for k in ("sharded", "mt_refine")})
    for v in inert.values():
        flags = v.pop("repeat_flags")
        v["ci"] = A.bootstrap_mean({str(i): float(x) for i, x in enumerate(flags)}, n_boot=n_boot, seed=seed)
    sec["inertia"] = inert
    sec["response_types"] = {k: A.response_types_per_turn(recs, k) for k in GREEDY_KINDS}
    lengths = {k: A.final_reply_lengths(recs, k) for k in GREEDY_KINDS}
    sec["final_reply"] = {k: {f: A.bootstrap_mean(v[f], n_boot=n_boot, seed=seed) for f in ("tokens", "cut", "echo")}
                          for k, v in lengths.items()}
    sec["uncut_strict"] = {k: A.bootstrap_mean(A.uncut_scores(recs, k), n_boot=n_boot, seed=seed)
                           for k in GREEDY_KINDS}
    sec["first_answer_turn"] = {k: first_answer_turn_stats(A.first_answer_turns(recs, k)) for k in GREEDY_KINDS
                                if any(r["kind"] == k for r in recs)}  # RECAP models have no MT-Refine
    sec["early_turns"] = {f: A.bootstrap_mean(v, n_boot=n_boot, seed=seed) for f, v in early.items()}  # ICPO's view
    if lic_recs:
        kinds = [k for k in ("full", "sharded") if any(r["kind"] == k for r in lic_recs)]
        rep = build_report(lic_recs, scenarios=kinds, protocol=lic_recs[0]["protocol"], n_boot=n_boot, seed=seed)
        sec["lic"] = {
            k: {
                m: rep["scenarios"][k][m]
                for m in ("P", "A90", "U90_10", "ci", "n_instructions", "n_runs", "ratio_to_full")
            }
            for k in rep["scenarios"]
        }
        last = {
            k: A.bootstrap_mean(A.last_reply_scores(lic_recs, k, "strict"), n_boot=n_boot, seed=seed) for k in kinds
        }
        for k in sec["lic"]:  # the judge-free cross-check of P: strict accuracy of the last reply
            sec["lic"][k]["last_reply_strict"] = last[k]
            for name, per_k in A.pass_k_scores(lic_recs, k).items():
                sec["lic"][k][name] = {str(j): A.bootstrap_mean(v, n_boot=n_boot, seed=seed) for j, v in per_k.items()}
    return sec


def _recap_as_sharded(recs: list[dict]) -> list[dict]:
    """A RECAP model's records with RECAP conversations in MT-Add's place (paired with the others' MT-Add)."""
    return [{**r, "kind": "sharded"} if r["kind"] == "recap" else r for r in recs]


def read_curves(run_dir: Path) -> dict[str, list[list[float]]]:
    """key -> [[step, value], ...] for every CURVE_KEYS or DYNAMICS_KEYS key logged in ``run_dir/metrics.jsonl``."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    return {
        k: [[r["step"], r[k]] for r in rows if isinstance(r.get(k), (int, float))]
        for k in dict.fromkeys((*CURVE_KEYS, *DYNAMICS_KEYS))
        if any(isinstance(r.get(k), (int, float)) for r in rows)
    }


def _run_section(run_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"curves": read_curves(run_dir)}
    for name, key in (("run_info.json", "info"), ("train_items.jsonl.stats.json", "filter"), ("best.json", "best")):
        if (run_dir / name).is_file():
            out[key] = json.loads((run_dir / name).read_text())
    if (run_dir / "config.json").is_file():
        conf = json.loads((run_dir / "config.json").read_text())
        rl = conf.get("rl", {})
        out["config"] = {
            "method": conf.get("method"),
            "data": conf.get("data", {}).get("add_source"),
            "refine": conf.get("data", {}).get("refine_source"),
            "filter": conf.get("filter", {}).get("enabled"),
            **{
                k: rl.get(k)
                for k in (
                    "steps",
                    "batch_size",
                    "group_size",
                    "lr",
                    "alpha",
                    "temperature",
                    "max_new_tokens",
                    "verifier_mode",
                    "beta",
                    "anchor_prompt",
                )
            },
        }
    return out


def build(out_dir: str | Path) -> dict[str, Any]:
    """The report dict from the files under ``out_dir`` (see the module docstring); the bootstrap
    replicates and seed are the manifest's (``bootstrap``, ``seed``)."""
    out = Path(out_dir)
    manifest = json.loads((out / "manifest.json").read_text())
    n_boot, seed = int(manifest.get("bootstrap", 1000)), int(manifest.get("seed", 0))
    names = [m["name"] for m in manifest["models"]]
    report: dict[str, Any] = {
        "manifest": manifest,
        "n_bootstrap": n_boot,
        "ci_level": A.CI_LEVEL,
        "models": {},
        "pairs": {},
        "runs": {},
        "code": {},
    }
    scores: dict[str, dict[str, dict[str, float]]] = {}
    early: dict[str, dict[str, float]] = {}  # per model, task -> non-answer share of the turns before the last
    for m in manifest["models"]:
        recs = load_records(out / "models" / m["name"] / "greedy")
        lic_dir = out / "models" / m["name"] / "lic"
        lic = (
            load_records(lic_dir)
            if (lic_dir / "transcripts.jsonl").is_file() or (lic_dir / "transcripts.jsonl.gz").is_file()
            else None
        )
        if m.get("recap"):  # LiC's RECAP (MT-Add's turns, then a recap of every shard) in the MT-Add column
            recs, lic = _recap_as_sharded(recs), lic and _recap_as_sharded(lic)
        scores[m["name"]] = kind_scores(recs, "strict")
        shares = A.early_turn_shares(recs, "sharded")
        early[m["name"]] = shares["non_answer"]
        report["models"][m["name"]] = _model_section(recs, lic, scores[m["name"]], shares, n_boot, seed)
        report["code"][m["name"]] = {sub: read_evaluation_code(out / "models" / m["name"] / sub)
                                     for sub in ("greedy", "lic")}
        run_dir = out / "runs" / m["name"]
        if run_dir.is_dir():
            report["runs"][m["name"]] = _run_section(run_dir)
    refs = set(manifest.get("pairs_with") or names)  # compare --pairs-with: only the pairs that involve these
    pairs = [(a, b) for a, b in itertools.combinations(names, 2) if a in refs or b in refs]
    pairs += [(a, b) for b, a in manifest.get("pairs", []) if (a, b) not in pairs]  # compare --pairs: B - A
    for a, b in pairs:
        report["pairs"][f"{b} - {a}"] = {
            k: A.bootstrap_paired(scores[a][k], scores[b][k], n_boot=n_boot, seed=seed)
            for k in TABLE_KINDS
        }
        report["pairs"][f"{b} - {a}"]["early_non_answer"] = A.bootstrap_paired(early[a], early[b], n_boot=n_boot,
                                                                               seed=seed)
    seeds = seeds_section(scores, names, report["runs"], list(DYNAMICS_KEYS), n_boot=n_boot, seed=seed)
    if seeds:  # arms of several seeds (`<arm>_s<N>` models)
        report["seeds"] = seeds
    return report


def write(report: dict[str, Any], out_dir: str | Path, md_path: str | Path) -> list[Path]:
    """Writes ``report.json``, the PNG plots and the markdown report; returns the paths."""
    from experiments.markdown import render
    from experiments.plots import make_plots

    out = Path(out_dir)
    paths = [write_json(out / "report.json", report)]
    report = json.loads(paths[0].read_text())  # the figures and markdown show exactly what the JSON holds
    paths += make_plots(report, out)
    md = Path(md_path)
    md.write_text(render(report, out, md.parent), encoding="utf-8")
    return paths + [md]

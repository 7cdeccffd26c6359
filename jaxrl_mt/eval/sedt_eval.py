"""SHARDED against SHARDED + SeDT on GSM8K problems (issue 7's evaluation).

    python -m jaxrl_mt.eval.sedt_eval --problems 50 --runs 4 --out /tmp/sedt_eval

A paired design: each conversation's earlier turns are simulated ONCE (turn by turn, one sampler
call per turn, KV cache kept, ``jaxrl_mt.sedt.run_until_final``); its final turn is then answered twice from
the same history: plainly (the SHARDED arm, ``run_conversations``) and with SeDT (one sampler
call for the annotated final turns, one for the corrections). Both arms use the same sampling
settings. The final turn is scored with the strict verifier, and P / A90 / U90-10
(``jaxrl_mt.eval.metrics``) are reported for both arms, plus SeDT without its self-correction,
the trigger rate, replacements, and the correction outcomes:

- helped: replaced, the SeDT answer was wrong and the correction right;
- hurt: replaced, the SeDT answer was right and the correction wrong (impossible under the
  default guard ``"no_answer"``, which only replaces an answer holding no number; the method's
  coverage-only guard is the ablation ``--set guard=coverage``).

The report states the guard mode; outcomes are counted with the strict verifier (the lenient
verifier's counts are in ``results.json`` under ``sedt.lenient``).

Writes ``results.json``, ``report.md`` and ``transcripts.jsonl`` (one line per conversation)
into ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_mt.conversations import ConversationRun, run_conversations
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import DataError
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.eval.metrics import aggregate
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.sampling import SamplingConfig
from jaxrl_mt.sedt import CONFIRMED, GivenUser, SeDTConfig, run_until_final, sedt_final_turn, summarize

__all__ = ["correction_outcomes", "main", "parse_overrides", "plan", "run_eval"]


def parse_overrides(items: Sequence[str]) -> SeDTConfig:
    """A SeDTConfig from ``FIELD=VALUE`` strings (values parsed as JSON, else kept as strings).

    Raises:
      ValueError: ``--set ITEM: ...`` for a malformed item or an unknown field.
    """
    fields = {f.name for f in dataclasses.fields(SeDTConfig)}
    kw: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
        try:
            kw[name] = json.loads(raw)
        except json.JSONDecodeError:
            kw[name] = raw
    return SeDTConfig(**kw)


def plan(source: str, problems: int, runs: int, *, system: str | None = None) -> list[ConversationRun]:
    """``runs`` SHARDED conversations for each of the first ``problems`` tasks of ``source``."""
    tasks = load_source(source)
    if len(tasks) < problems:
        raise DataError(f"source {source!r}: holds {len(tasks)} problems, {problems} asked for")
    out = []
    for task in tasks[:problems]:
        sc = build_scenario(task, "sharded")
        for r in range(runs):
            out.append(ConversationRun(conv_id=f"{task.task_id}|sharded|{r}", system=system, user_turns=list(sc.turns),
                                       meta={"task_id": task.task_id, "run": r, "answer": task.answer,
                                             "domain": task.domain, "n_planned": len(sc.turns)}))
    return out


def correction_outcomes(infos: Sequence[Mapping[str, Any]], golds: Sequence[str], mode: str = "strict") -> dict:
    """Counts of replacements that helped or hurt (judged by the verifier against the gold answer).

    Args:
      infos: ``turn.info["sedt"]`` records (``original``, ``correction``, ``replaced``).
      golds: the gold answers, one per record.
      mode: the verifier mode, ``"strict"`` or ``"lenient"``.

    Returns:
      ``{"replaced", "helped", "hurt", "neutral"}``.
    """
    out = {"replaced": 0, "helped": 0, "hurt": 0, "neutral": 0}
    for info, gold in zip(infos, golds):
        if not info["replaced"]:
            continue
        before, after = verify(info["original"], gold, mode), verify(info["correction"], gold, mode)
        out["replaced"] += 1
        out["helped" if after > before else "hurt" if after < before else "neutral"] += 1
    return out


def _by_task(runs: Sequence[ConversationRun], scores: Sequence[float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r, s in zip(runs, scores):
        out.setdefault(r.meta["task_id"], []).append(float(s))
    return out


def run_eval(sampler: Any, runs: list[ConversationRun], sampling: SamplingConfig, *, cfg: SeDTConfig, seed: int = 0,
             log=lambda s: None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Simulates the runs and scores both arms (see the module docstring).

    Returns:
      ``(results, transcript records)``.
    """
    t0 = time.perf_counter()

    def progress(k: int, n: int) -> None:
        log(f"history turn {k + 1}: {n} conversations, {time.perf_counter() - t0:.0f}s")

    held, finals, final_seed = run_until_final(sampler, runs, sampling, cfg=cfg, seed=seed, progress=progress,
                                               reuse_cache=True)
    if len(held) != len(runs):
        raise ValueError(f"{len(runs) - len(held)} conversations have fewer than {cfg.min_turns} turns")
    log(f"final turn, plain: {len(held)} conversations, {time.perf_counter() - t0:.0f}s")
    plain = [copy.deepcopy(r) for r in held]
    run_conversations(sampler, plain, sampling, seed=final_seed, user=GivenUser(plain, finals), max_turns=1)
    log(f"final turn, SeDT: {len(held)} conversations, {time.perf_counter() - t0:.0f}s")
    infos = sedt_final_turn(sampler, held, finals, sampling, cfg=cfg, seed=final_seed)
    golds = [r.meta["answer"] for r in held]
    s_plain = [verify(r.turns[-1].assistant, g) for r, g in zip(plain, golds)]
    s_sedt = [verify(r.turns[-1].assistant, g) for r, g in zip(held, golds)]
    s_nocorr = [verify(i["original"], g) for i, g in zip(infos, golds)]
    labels = [i["annotation"]["labels"] for i in infos]
    arms = {"sharded": s_plain, "sharded+sedt": s_sedt, "sharded+sedt (no correction)": s_nocorr}
    results: dict[str, Any] = {
        "n_problems": len({r.meta["task_id"] for r in held}), "n_conversations": len(held),
        "n_runs_per_problem": len(held) // max(1, len({r.meta["task_id"] for r in held})),
        "metrics": {name: aggregate(_by_task(held, sc), scale=100) for name, sc in arms.items()},
        "correct": {name: int(np.sum(sc)) for name, sc in arms.items()},
        "sedt": {"guard": cfg.guard, **summarize(infos), **correction_outcomes(infos, golds),
                 "lenient": correction_outcomes(infos, golds, "lenient"),
                 "mean_uncertain_fraction": float(np.mean([np.mean([x != CONFIRMED for x in y]) for y in labels])),
                 "last_shard_confirmed": float(np.mean([labs[-1] == CONFIRMED for labs in labels]))},
        "paired": {"plain_only": int(sum(a > b for a, b in zip(s_plain, s_sedt))),
                   "sedt_only": int(sum(b > a for a, b in zip(s_plain, s_sedt)))},
        "sampling": dataclasses.asdict(sampling), "sedt_config": dataclasses.asdict(cfg), "seed": seed,
        "seconds": time.perf_counter() - t0,
    }
    records = []
    for p, r, info, g, a, b in zip(plain, held, infos, golds, s_plain, s_sedt):
        records.append({"conv_id": r.conv_id, "gold": g, "user_turns": r.user_turns,
                        "history": [{"user": t.user, "assistant": t.assistant} for t in r.turns[:-1]],
                        "plain": {"answer": p.turns[-1].assistant, "correct": a},
                        "sedt": {"answer": r.turns[-1].assistant, "correct": b, **info}})
    return results, records


def report_md(results: Mapping[str, Any]) -> str:
    """A short Markdown table of the results."""
    lines = [f"# SHARDED vs SHARDED + SeDT ({results['n_problems']} GSM8K problems, N = "
             f"{results['n_runs_per_problem']}, strict verifier on the final turn)", "",
             "| arm | P | A90 | U90-10 | correct |", "|---|---:|---:|---:|---:|"]
    for name, m in results["metrics"].items():
        lines.append(f"| {name} | {m['P']:.1f} | {m['A90']:.1f} | {m['U90_10']:.1f} | "
                     f"{results['correct'][name]}/{results['n_conversations']} |")
    s = results["sedt"]
    lines += ["", f"- guard: {s['guard']}",
              f"- trigger rate: {s['trigger_rate']:.3f} ({s['triggered']}/{s['n']})",
              f"- replacements: {s['replaced']} (helped {s['helped']}, hurt {s['hurt']}, neutral {s['neutral']})",
              f"- mean fraction of UNCERTAIN turns: {s['mean_uncertain_fraction']:.3f}; final shard CONFIRMED in "
              f"{s['last_shard_confirmed']:.3f} of conversations",
              f"- paired: right only plainly {results['paired']['plain_only']}, right only with SeDT "
              f"{results['paired']['sedt_only']}",
              f"- sampling: {results['sampling']}; {results['seconds']:.0f} s"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.eval.sedt_eval", description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=50, help="GSM8K problems (>= 1)")
    ap.add_argument("--runs", type=int, default=4, help="N: conversations per problem")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--source", default="gsm8k:@", help="task source spec (jaxrl_mt.data.load_source)")
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model spec")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-batch", type=int, default=32,
                    help="rows per sampler call (prefill memory grows with rows x prompt length^2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mesh-shape", default="auto",
                    help="devices: auto (all on data when > 1) | none | data,fsdp,tensor")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="SeDTConfig override (repeatable), e.g. guard=coverage for the coverage-only guard ablation")
    a = ap.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if a.problems < 1 or a.runs < 1:
            raise ValueError(f"--problems and --runs must be >= 1, got {a.problems}, {a.runs}")
        cfg = parse_overrides(a.set)
        sampling = SamplingConfig(max_new_tokens=a.max_new_tokens, temperature=a.temperature).validate()
        runs = plan(a.source, a.problems, a.runs)
    except (ValueError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.parallel import mesh_from_spec
    from jaxrl_mt.sampling import Sampler

    try:
        mesh = mesh_from_spec(a.mesh_shape)
    except ValueError as e:
        ap.error(f"--mesh-shape: {e}")
    model = load_model(a.model)
    sampler = Sampler.from_model(model, max_batch=a.max_batch, mesh=mesh)
    log(f"{len(runs)} conversations ({a.problems} problems x {a.runs} runs), model {a.model}")
    results, records = run_eval(sampler, runs, sampling, cfg=cfg, seed=a.seed, log=log)
    results["model"] = a.model
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(report_md(results), encoding="utf-8")
    with open(out / "transcripts.jsonl", "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(report_md(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

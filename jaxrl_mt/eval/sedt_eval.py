"""SeDT against its controls on GSM8K problems, all arms on the same histories (issues 7 and 19).

    python -m jaxrl_mt.eval.sedt_eval --problems 30 --runs 2 --out /tmp/sedt_eval

A paired design: each conversation's earlier turns are simulated ONCE (turn by turn, one sampler
call per turn, KV cache kept, ``jaxrl_mt.sedt.run_until_final``); its final turn is then answered
once per arm from that same history, with the same seed and sampling settings:

- ``sharded (no format)``: the final shard as it is (only with a format instruction: what it alone does);
- ``sharded``: the final shard plus the answer-format instruction on its own line;
- ``restated (control)``: every shard restated in one message, no relevance annotation and no
  self-correction (``jaxrl_mt.sedt.restate_final_turn``: SeDT's prompt minus the return-to-go,
  the labels and "Use every CONFIRMED message");
- ``sharded+sedt (no correction)``: SeDT's annotated prompt, its first answer;
- ``sharded+sedt``: the same after the guarded self-correction;
- with ``--set ablations=all`` (or a comma-separated subset), SeDT's ablations
  (``jaxrl_mt.sedt.ablations``, no self-correction): ``ablation: semantic_only``,
  ``ablation: lexical_only``, ``ablation: positional_only``, ``ablation: uniform`` and
  ``ablation: random_rtg``, each with its paired dP interval from SeDT's first answer and from the control.

Every arm but the first ends its final message with the SAME answer instruction (the domain's
``SeDTConfig.answer_format``, 'Solve it step by step and end with "The answer is <number>."'
for math); ``--no-format`` drops it from every arm. The report then separates the steps: format
only (sharded - no format), restating (control - sharded), the annotation (SeDT without
correction - control) and the self-correction. The final turn is scored with the strict
verifier; P / A90 / U90-10 (``jaxrl_mt.eval.metrics``) per arm, with 95% bootstrap intervals over
problems of P and (paired) of each step's dP, plus the trigger rate,
replacements and the correction outcomes (helped: the correction right where the SeDT answer
was wrong; hurt: the reverse, impossible under the default guard ``"no_answer"``; the
coverage-only guard is the ablation ``--set guard=coverage``); the lenient verifier's counts are
in ``results.json`` under ``sedt.lenient``.

Default source: the shipped GSM8K *test* sample (``gsm8k:@gsm8k/test_sample.jsonl``), not the RL training one.

Writes ``settings.json``, ``transcripts.jsonl`` (one line per conversation) and ``blocks.jsonl``
into ``--out`` as it goes, ``--block`` problems at a time (a killed run resumes after its last
finished block; memory holds one block), then ``results.json`` and ``report.md``, which
`results_from_records` recomputes from the transcripts alone.
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
from jaxrl_mt.eval.metrics import aggregate, bootstrap_ci, paired_bootstrap_ci
from jaxrl_mt.eval.sedt_files import read_jsonl, resume, stored_config
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.sampling import SamplingConfig
from jaxrl_mt.sedt import (ABLATIONS, CONFIRMED, Annotation, GivenUser, SeDTConfig, ablation_final_turn,
                           restate_final_turn, run_until_final, sedt_final_turn, summarize, with_answer_format)

__all__ = ["ABLATION_ARMS", "DEFAULT_SOURCE", "STEPS", "correction_outcomes", "final_arms", "main", "parse_overrides",
           "plan", "report_md", "results_from_records", "run_block", "run_blocks", "run_eval", "step_differences"]


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


NO_FORMAT, PLAIN, CONTROL, SEDT_NC, SEDT = ("sharded (no format)", "sharded", "restated (control)",
                                          "sharded+sedt (no correction)", "sharded+sedt")
STEPS = (  # (what the step adds, arm before, arm after): the differences the report separates
    ("the format instruction only", NO_FORMAT, PLAIN),
    ("restating every shard in one message", PLAIN, CONTROL),
    ("the relevance annotation (return-to-go, labels)", CONTROL, SEDT_NC),
    ("the guarded self-correction", SEDT_NC, SEDT),
)
ABLATION_ARMS = {n: f"ablation: {n}" for n in ABLATIONS}  # SeDTConfig.ablations name -> arm name
ABLATION_BASELINES = ((SEDT_NC, "SeDT's relevance"), (CONTROL, "no annotation"))  # each ablation's paired dP from these
DEFAULT_SOURCE = "gsm8k:@gsm8k/test_sample.jsonl"


def _plain_final(sampler: Any, held: Sequence[ConversationRun], messages: Sequence[str], sampling: SamplingConfig,
                 seed: int) -> list[ConversationRun]:
    """Copies of the held runs with one more plain turn (``messages``) answered at ``seed``."""
    runs = [copy.deepcopy(r) for r in held]
    run_conversations(sampler, runs, sampling, seed=seed, user=GivenUser(runs, messages), max_turns=1)
    return runs


def final_arms(sampler: Any, held: list[ConversationRun], finals: Sequence[str], sampling: SamplingConfig, *,
               cfg: SeDTConfig, seed: int, log=lambda s: None
               ) -> tuple[dict[str, list[ConversationRun]], list[dict[str, Any]], list[str]]:
    """Answers the held final turns once per arm, every arm from the same history and ``seed``.

    Returns:
      ``(arm name -> runs with their final turn, SeDT infos, the answer instruction per run)``;
      the SeDT arm's runs are ``held`` itself (answered after the others were copied); the
      ablation arms (``cfg.ablations``) rewrite SeDT's annotations, so they are answered last.
    """
    fmts = [cfg.answer_format(r.meta.get("domain", "math")) for r in held]
    arms: dict[str, list[ConversationRun]] = {}
    if any(fmts):
        log(f"final turn, {NO_FORMAT}: {len(held)} conversations")
        arms[NO_FORMAT] = _plain_final(sampler, held, finals, sampling, seed)
    log(f"final turn, {PLAIN}: {len(held)} conversations")
    arms[PLAIN] = _plain_final(sampler, held, [with_answer_format(u, f) for u, f in zip(finals, fmts)], sampling,
                               seed)
    log(f"final turn, {CONTROL}: {len(held)} conversations")
    arms[CONTROL] = [copy.deepcopy(r) for r in held]
    restate_final_turn(sampler, arms[CONTROL], finals, sampling, cfg=cfg, seed=seed)
    copies = {n: [copy.deepcopy(r) for r in held] for n in cfg.ablations}
    log(f"final turn, SeDT: {len(held)} conversations")
    infos = sedt_final_turn(sampler, held, finals, sampling, cfg=cfg, seed=seed)
    arms[SEDT] = held
    base = [Annotation.from_json(i["annotation"]) for i in infos]
    for n, runs in copies.items():
        log(f"final turn, {ABLATION_ARMS[n]}: {len(held)} conversations")
        ablation_final_turn(sampler, runs, finals, sampling, base=base, name=n, cfg=cfg, seed=seed)
        arms[ABLATION_ARMS[n]] = runs
    return arms, infos, fmts


def step_differences(metrics: Mapping[str, Mapping[str, float]], correct: Mapping[str, int],
                     by_task: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
                     steps: Sequence[tuple[str, str, str]] = STEPS) -> list[dict[str, Any]]:
    """What each step adds: P / A90 / U90-10 and correct-count differences between consecutive arms;
    with `by_task` (arm -> task -> run scores) also the paired 95% bootstrap interval of dP.
    ``steps``: the ``(what, arm before, arm after)`` pairs (default ``STEPS``; pairs of absent arms are skipped)."""
    out = []
    for what, before, after in steps:
        if before in metrics and after in metrics:
            d = {k: metrics[after][k] - metrics[before][k] for k in ("P", "A90", "U90_10")}
            out.append({"step": what, "from": before, "to": after, **{f"d{k}": v for k, v in d.items()},
                        "dcorrect": correct[after] - correct[before]})
            if by_task is not None:
                out[-1]["dP_ci"] = paired_bootstrap_ci(by_task[before], by_task[after], "P", scale=100)
    return out


def run_eval(sampler: Any, runs: list[ConversationRun], sampling: SamplingConfig, *, cfg: SeDTConfig, seed: int = 0,
             log=lambda s: None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Simulates the runs and scores every arm (see the module docstring) in one block.

    Returns:
      ``(results, transcript records)``; ``results == results_from_records(records, ...)``.
    """
    t0 = time.perf_counter()
    records = run_block(sampler, runs, sampling, cfg=cfg, seed=seed, log=log)
    return results_from_records(records, sampling, cfg, seed, time.perf_counter() - t0), records


def run_block(sampler: Any, runs: list[ConversationRun], sampling: SamplingConfig, *, cfg: SeDTConfig,
              seed: int = 0, log=lambda s: None) -> list[dict[str, Any]]:
    """The transcript records of ``runs``: histories simulated once, then every arm's final turn."""
    t0 = time.perf_counter()

    def progress(k: int, n: int) -> None:
        log(f"history turn {k + 1}: {n} conversations, {time.perf_counter() - t0:.0f}s")

    held, finals, final_seed = run_until_final(sampler, runs, sampling, cfg=cfg, seed=seed, progress=progress,
                                               reuse_cache=True)
    if len(held) != len(runs):
        raise ValueError(f"{len(runs) - len(held)} conversations have fewer than {cfg.min_turns} turns")
    arms, infos, fmts = final_arms(sampler, held, finals, sampling, cfg=cfg, seed=final_seed,
                                   log=lambda s: log(f"{s}, {time.perf_counter() - t0:.0f}s"))
    golds = [r.meta["answer"] for r in held]
    scores = {name: [verify(r.turns[-1].assistant, g) for r, g in zip(rs, golds)] for name, rs in arms.items()}
    scores[SEDT_NC] = [verify(i["original"], g) for i, g in zip(infos, golds)]
    return _records(held, arms, infos, golds, scores, fmts)


ARM_ORDER = (NO_FORMAT, PLAIN, CONTROL, SEDT_NC, SEDT, *ABLATION_ARMS.values())
ABLATION_STEPS = tuple((f"{n} vs {what}", b, arm) for n, arm in ABLATION_ARMS.items() for b, what in ABLATION_BASELINES)


def results_from_records(records: Sequence[Mapping[str, Any]], sampling: SamplingConfig, cfg: SeDTConfig,
                         seed: int, seconds: float) -> dict[str, Any]:
    """Every figure of the report, recomputed from the transcript records alone (plus the settings)."""
    if not records:
        raise ValueError("no transcript records to score")
    names = [n for n in ARM_ORDER if n in records[0]["arms"]]
    scores = {n: [float(r["arms"][n]["correct"]) for r in records] for n in names}
    infos = [r["sedt"] for r in records]
    golds = [r["gold"] for r in records]
    labels = [i["annotation"]["labels"] for i in infos]
    by_task: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for i, r in enumerate(records):
        for n in names:
            by_task[n].setdefault(r["task_id"], []).append(scores[n][i])
    n_tasks = len(by_task[names[0]])
    metrics = {n: aggregate(by_task[n], scale=100) for n in names}
    correct = {n: int(np.sum(sc)) for n, sc in scores.items()}
    return {
        "n_problems": n_tasks, "n_conversations": len(records), "n_runs_per_problem": len(records) // n_tasks,
        "arms": names, "answer_format": sorted({r["answer_format"] for r in records}), "metrics": metrics,
        "correct": correct, "steps": step_differences(metrics, correct, by_task),
        "ablations": step_differences(metrics, correct, by_task, ABLATION_STEPS),
        "P_ci": {n: bootstrap_ci(by_task[n], "P", scale=100) for n in names},
        "sedt": {"guard": cfg.guard, **summarize(infos), **correction_outcomes(infos, golds),
                 "lenient": correction_outcomes(infos, golds, "lenient"),
                 "mean_uncertain_fraction": float(np.mean([np.mean([x != CONFIRMED for x in y]) for y in labels])),
                 "last_shard_confirmed": float(np.mean([labs[-1] == CONFIRMED for labs in labels]))},
        "paired": {"plain_only": int(sum(a > b for a, b in zip(scores[PLAIN], scores[SEDT]))),
                   "sedt_only": int(sum(b > a for a, b in zip(scores[PLAIN], scores[SEDT])))},
        "sampling": dataclasses.asdict(sampling), "sedt_config": dataclasses.asdict(cfg), "seed": seed,
        "seconds": seconds,
    }


def _records(held: Sequence[ConversationRun], arms: Mapping[str, Sequence[ConversationRun]],
             infos: Sequence[Mapping[str, Any]], golds: Sequence[str], scores: Mapping[str, Sequence[float]],
             fmts: Sequence[str]) -> list[dict[str, Any]]:
    """One transcript record per conversation: the shared history, then each arm's final turn."""
    out = []
    for i, r in enumerate(held):
        rec = {"conv_id": r.conv_id, "task_id": r.meta["task_id"], "gold": golds[i], "answer_format": fmts[i],
               "user_turns": r.user_turns,
               "history": [{"user": t.user, "assistant": t.assistant} for t in r.turns[:-1]], "arms": {}}
        for name, rs in arms.items():
            last = rs[i].turns[-1]
            kind = next((k for k in ("restate", "sedt", "ablation") if k in last.info), None)
            msg = last.info[kind]["prompt"] if kind else last.user
            rec["arms"][name] = {"message": msg, "answer": last.assistant, "correct": scores[name][i]}
            if kind == "ablation":
                rec["arms"][name]["annotation"] = last.info[kind]["annotation"]
        rec["arms"][SEDT_NC] = {"message": infos[i]["prompt"], "answer": infos[i]["original"],
                                "correct": scores[SEDT_NC][i]}
        rec["sedt"] = dict(infos[i])
        out.append(rec)
    return out


BLOCK_SEED_STRIDE = 104729  # seed offset between blocks (a prime far from conversations.SEED_STRIDE)


def run_blocks(sampler: Any, runs: Sequence[ConversationRun], sampling: SamplingConfig, *, cfg: SeDTConfig,
               seed: int, out: Path, block: int, settings: Mapping[str, Any], log=lambda s: None
               ) -> tuple[list[dict[str, Any]], float]:
    """Runs the conversations ``block`` problems at a time, appending each finished block to ``out``.

    Block ``i`` (its problems' runs, in plan order) is simulated by `run_block` at seed
    ``seed + BLOCK_SEED_STRIDE * i``; its records go to ``transcripts.jsonl`` and then a line to
    ``blocks.jsonl``. A rerun with the same settings skips the blocks listed there (records of a
    block cut short are dropped), so a killed run resumes and ends with the same records; memory
    holds one block's conversations at a time.

    Returns:
      ``(all records in plan order, seconds spent over every run of this evaluation)``.
    """
    from jaxrl_mt.parallel import broadcast_json, is_main_process

    main = is_main_process()  # several processes: each runs every block; process 0 alone reads and writes `out`
    task_order = list(dict.fromkeys(r.meta["task_id"] for r in runs))
    block_of = {t: i // block for i, t in enumerate(task_order)}
    done, kept, err = resume(out, settings, log) if main else ({}, [], "")
    state = broadcast_json({"err": err, "done": {str(i): d for i, d in done.items()}})
    if state["err"]:
        raise ValueError(state["err"])
    done = {int(i): d for i, d in state["done"].items()}
    n_blocks = max(block_of.values()) + 1
    if done:
        log(f"resuming: {len(done)}/{n_blocks} blocks done ({len(kept)} conversations)")
    for i in range(n_blocks):
        if i in done:
            continue
        t0 = time.perf_counter()
        mine = [r for r in runs if block_of[r.meta["task_id"]] == i]
        recs = run_block(sampler, mine, sampling, cfg=cfg, seed=seed + BLOCK_SEED_STRIDE * i,
                         log=lambda s, i=i: log(f"block {i + 1}/{n_blocks}: {s}"))
        if not main:
            continue
        with open(out / "transcripts.jsonl", "a", encoding="utf-8") as f:
            f.writelines(json.dumps({**r, "block": i}, ensure_ascii=False) + "\n" for r in recs)
        with open(out / "blocks.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"block": i, "n": len(recs), "seconds": time.perf_counter() - t0}) + "\n")
        kept += [{**r, "block": i} for r in recs]
    order = {r.conv_id: k for k, r in enumerate(runs)}
    kept.sort(key=lambda r: order[r["conv_id"]])
    return kept, sum(d["seconds"] for d in read_jsonl(out / "blocks.jsonl")) if main else 0.0


def report_md(results: Mapping[str, Any]) -> str:
    """A short Markdown report: the arms' table, what each step adds, SeDT's trigger and replacements."""
    fmt = results["answer_format"]
    lines = [f"# SeDT and its controls ({results['n_problems']} GSM8K problems, N = "
             f"{results['n_runs_per_problem']}, strict verifier on the final turn, same histories)", "",
             "| arm | P [95% CI] | A90 | U90-10 | correct |", "|---|---:|---:|---:|---:|"]
    for name in results["arms"]:
        m, (lo, hi) = results["metrics"][name], results["P_ci"][name]
        lines.append(f"| {name} | {m['P']:.1f} [{lo:.1f}, {hi:.1f}] | {m['A90']:.1f} | {m['U90_10']:.1f} | "
                     f"{results['correct'][name]}/{results['n_conversations']} |")
    if any(fmt):
        lines += ["", f"Every arm but `{NO_FORMAT}` ends its final message with the same instruction: "
                  + "; ".join(f"{f!r}" for f in fmt if f) + f". The format-only difference is `{PLAIN}` - "
                  f"`{NO_FORMAT}`."]
    else:
        lines += ["", "No arm gets an answer-format instruction (`--no-format`)."]
    lines += _difference_table("step", results["steps"])
    if results.get("ablations"):
        lines += ["", "SeDT's ablations (no self-correction), each against SeDT's first answer and the control:"]
        lines += _difference_table("ablation", results["ablations"])
    s = results["sedt"]
    lines += ["", f"- guard: {s['guard']}",
              f"- trigger rate: {s['trigger_rate']:.3f} ({s['triggered']}/{s['n']})",
              f"- replacements: {s['replaced']} (helped {s['helped']}, hurt {s['hurt']}, neutral {s['neutral']})",
              f"- mean fraction of UNCERTAIN turns: {s['mean_uncertain_fraction']:.3f}; final shard CONFIRMED in "
              f"{s['last_shard_confirmed']:.3f} of conversations",
              f"- paired ({PLAIN} vs {SEDT}): right only plainly {results['paired']['plain_only']}, right only "
              f"with SeDT {results['paired']['sedt_only']}",
              f"- sampling: {results['sampling']}; {results['seconds']:.0f} s"]
    return "\n".join(lines) + "\n"


def _difference_table(what: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A Markdown table of `step_differences` rows (with their paired intervals)."""
    lines = ["", f"| {what} | from -> to | dP [paired 95% CI] | dA90 | dU90-10 | d correct |",
             "|---|---|---:|---:|---:|---:|"]
    for d in rows:
        lines.append(f"| {d['step']} | {d['from']} -> {d['to']} | {d['dP']:+.1f} [{d['dP_ci'][0]:+.1f}, "
                     f"{d['dP_ci'][1]:+.1f}] | {d['dA90']:+.1f} | {d['dU90_10']:+.1f} | {d['dcorrect']:+d} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.eval.sedt_eval", description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=50, help="GSM8K problems (>= 1)")
    ap.add_argument("--runs", type=int, default=4, help="N: conversations per problem")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--source", default=DEFAULT_SOURCE,
                    help="task source spec (jaxrl_mt.data.load_source); default: the shipped GSM8K test sample")
    ap.add_argument("--no-format", action="store_true",
                    help="no answer-format instruction in any arm (default: the same one in every arm)")
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model spec")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-batch", type=int, default=32,
                    help="rows per sampler call (prefill memory grows with rows x prompt length^2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block", type=int, default=10,
                    help="problems per block: each finished block is written at once, a rerun resumes after it")
    ap.add_argument("--mesh-shape", default="auto", help="devices: auto (all on data) | none | data,fsdp,tensor")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="SeDTConfig override (repeatable), e.g. guard=coverage for the coverage-only guard ablation, "
                    "ablations=all (or a comma-separated subset of " + ",".join(ABLATIONS) + ") for the ablation arms")
    a = ap.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if a.problems < 1 or a.runs < 1 or a.block < 1:
            raise ValueError(f"--problems, --runs and --block must be >= 1, got {a.problems}, {a.runs}, {a.block}")
        cfg = parse_overrides(a.set)
        if a.no_format:
            cfg = dataclasses.replace(cfg, answer_formats=())
        sampling = SamplingConfig(max_new_tokens=a.max_new_tokens, temperature=a.temperature).validate()
        runs = plan(a.source, a.problems, a.runs)
    except (ValueError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.parallel import is_main_process, maybe_initialize_distributed, mesh_from_spec
    from jaxrl_mt.sampling import Sampler

    maybe_initialize_distributed()  # several processes (JAX_COORDINATOR_ADDRESS, ...): one global mesh

    try:
        mesh = mesh_from_spec(a.mesh_shape)
    except ValueError as e:
        ap.error(f"--mesh-shape: {e}")
    model = load_model(a.model)
    sampler = Sampler.from_model(model, max_batch=a.max_batch, mesh=mesh)
    log(f"{len(runs)} conversations ({a.problems} problems x {a.runs} runs, blocks of {a.block} problems), "
        f"model {a.model}")
    out = Path(a.out)
    settings = {"model": a.model, "source": a.source, "problems": a.problems, "runs": a.runs, "block": a.block,
                "seed": a.seed, "sampling": dataclasses.asdict(sampling), "sedt_config": stored_config(cfg)}
    try:
        records, seconds = run_blocks(sampler, runs, sampling, cfg=cfg, seed=a.seed, out=out, block=a.block,
                                      settings=settings, log=log)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not is_main_process():
        return 0
    results = results_from_records(records, sampling, cfg, a.seed, seconds)
    results["model"] = a.model
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(report_md(results), encoding="utf-8")
    print(report_md(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Collects the embedded model's real replies for labelling the answer-attempt judge.

``python -m jaxrl_mt.eval.collect_replies --out FILE.jsonl`` runs FULL, SHARDED and
underspecified (ICPO) conversations on synthetic, GSM8K-test and LiC-math problems, greedy and
at T = 1, and writes one JSON line per assistant turn: ``{"id", "text", "label": null, "split",
"source", "kind", "turn", "temperature", "task_id", "question", "user"}``.

``split`` ("tune" or "heldout") is fixed per *task* (a hash of the task id), before any label or
rule exists, so the replies of one problem never sit on both sides; the judge's rules are written
from the tune part only and scored on the held-out part. ``--split NAME`` puts every reply in one
named split instead (a fresh held-out set), ``--source NAME=SPEC[START:STOP]`` (repeatable)
replaces the default problems (SPEC: a :func:`~jaxrl_mt.data.loaders.load_source` spec, or
``synthetic:N:STEPS:SEED``), and ``--exclude-tasks FILE.jsonl`` skips every task id already in
such a file, so a new set stays disjoint by task from the old ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from jaxrl_mt.conversations import ConversationRun, run_conversations
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.data.synthetic import synthetic_tasks
from jaxrl_mt.sampling import SamplingConfig

log = logging.getLogger(__name__)

KINDS = ("full", "sharded", "underspecified")


def split_of(task_id: str, heldout_fraction: float = 0.5) -> str:
    """``"heldout"`` or ``"tune"``, a deterministic function of the task id."""
    h = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "heldout" if h < heldout_fraction else "tune"


def default_tasks() -> list[tuple[str, ShardedTask]]:
    """(source name, task) pairs: one- and two-step synthetic, GSM8K test sample, LiC math."""
    out = [("synthetic1", t) for t in synthetic_tasks(24, steps=1, seed=7)]
    out += [("synthetic2", t) for t in synthetic_tasks(12, steps=2, seed=8)]
    out += [("gsm8k_test", t) for t in load_source("gsm8k:@gsm8k/test_sample.jsonl")[:14]]
    out += [("lic_math", t) for t in load_source("lic:@")]
    return out


_SLICE = re.compile(r"\[(\d*):(\d*)\]$")


def parse_source(arg: str) -> tuple[str, list[ShardedTask]]:
    """Loads the tasks of one ``--source NAME=SPEC[START:STOP]`` argument.

    SPEC is a :func:`load_source` spec, or ``synthetic:N:STEPS:SEED`` (ids ``synthetic/SEED/i``,
    so one- and two-step sets of different seeds never share an id); the optional ``[START:STOP]``
    keeps that slice of the loaded list.

    Returns:
      ``(name, tasks)``.

    Raises:
      DataError: no ``NAME=``, a bad synthetic spec, or an empty selection.
    """
    name, sep, spec = arg.partition("=")
    if not sep or not name or not spec:
        raise DataError(f"--source {arg!r}: expected NAME=SPEC[START:STOP]")
    m = _SLICE.search(spec)
    if m:
        spec = spec[:m.start()]
    parts = spec.split(":")
    if parts[0] == "synthetic" and len(parts) == 4:
        try:
            n, steps, seed = (int(x) for x in parts[1:])
        except ValueError:
            raise DataError(f"--source {arg!r}: expected synthetic:N:STEPS:SEED with integers") from None
        tasks = synthetic_tasks(n, steps=steps, seed=seed)
    else:
        tasks = load_source(spec)
    if m:
        tasks = tasks[int(m[1]) if m[1] else None:int(m[2]) if m[2] else None]
    if not tasks:
        raise DataError(f"--source {arg!r}: selects no task")
    return name, tasks


def excluded_task_ids(paths: Iterable[str | Path]) -> set[str]:
    """Every ``task_id`` in the given JSONL files (records without one are ignored).

    Raises:
      DataError: a line that is not JSON, naming file and line.
    """
    ids = set()
    for path in paths:
        for k, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{k}: not JSON ({e.msg})") from None
            if isinstance(rec, dict) and isinstance(rec.get("task_id"), str):
                ids.add(rec["task_id"])
    return ids


def plan(tasks: Sequence[tuple[str, ShardedTask]], kinds: Sequence[str], seed: int) -> list[ConversationRun]:
    """One conversation per (task, kind)."""
    runs = []
    for source, task in tasks:
        for kind in kinds:
            try:
                sc = build_scenario(task, kind, seed=seed)
            except DataError:
                continue
            meta = {"task_id": task.task_id, "kind": kind, "source": source, "question": task.full_prompt}
            runs.append(ConversationRun(conv_id=f"{task.task_id}|{kind}", system=None,
                                        user_turns=list(sc.turns), meta=meta))
    return runs


def records(runs: Sequence[ConversationRun], temperature: float, max_new_tokens: int | None = None,
            split: str | None = None) -> list[dict]:
    """One unlabelled record per assistant turn (``split``: a fixed split name instead of the hash)."""
    out = []
    for r in runs:
        for t in r.turns:
            m = r.meta
            rec = {"id": f"{r.conv_id}|{t.index}|T{temperature:g}", "text": t.assistant, "label": None,
                   "split": split or split_of(m["task_id"]), "source": m["source"], "kind": m["kind"],
                   "turn": t.index + 1, "temperature": temperature, "task_id": m["task_id"],
                   "question": m["question"], "user": t.user}
            if max_new_tokens is not None:
                rec["max_new_tokens"] = max_new_tokens
            out.append(rec)
    return out


def _every_other(run: ConversationRun, share: float) -> bool:
    """Whether a task's conversations are also sampled at T > 0 (a fixed share of the tasks)."""
    h = int(hashlib.sha256(("sampled|" + run.meta["task_id"]).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return h < share


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sampled-share", type=float, default=0.5, help="share of the tasks also run at T > 0")
    ap.add_argument("--source", action="append", default=[], metavar="NAME=SPEC[START:STOP]",
                    help="problems to run (repeatable; replaces the default set)")
    ap.add_argument("--exclude-tasks", action="append", default=[], metavar="FILE.jsonl",
                    help="skip every task id found in this file (repeatable)")
    ap.add_argument("--split", default=None, help="write this split name on every reply (default: by task hash)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from jaxrl_mt.eval.simulator import LengthSortedSampler
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.sampling import Sampler

    sampler = LengthSortedSampler(Sampler.from_model(load_model(a.model)))
    tasks = [(name, t) for name, ts in map(parse_source, a.source) for t in ts] if a.source else default_tasks()
    skip = excluded_task_ids(a.exclude_tasks)
    tasks = [(name, t) for name, t in tasks if t.task_id not in skip]
    base = plan(tasks, KINDS, a.seed)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()  # (conv_id, temperature) already written: a killed run resumes after them
    if out.exists():
        for line in out.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break  # a truncated last line: that batch is redone
            done.add((rec["id"].rsplit("|", 2)[0], rec["temperature"]))
    n = 0
    for temp in (float(x) for x in a.temperatures.split(",")):
        sampling = SamplingConfig(max_new_tokens=a.max_new_tokens, temperature=temp)
        todo = [r for r in base if (r.conv_id, temp) not in done and (temp == 0 or _every_other(r, a.sampled_share))]
        for i in range(0, len(todo), a.batch):
            runs = [ConversationRun(conv_id=r.conv_id, system=r.system, user_turns=list(r.user_turns),
                                    meta=dict(r.meta)) for r in todo[i:i + a.batch]]
            run_conversations(sampler, runs, sampling, seed=a.seed + base.index(todo[i]), reuse_cache=True)
            recs = records(runs, temp, a.max_new_tokens, a.split)
            with open(out, "a", encoding="utf-8") as f:  # one batch at a time: nothing lost when killed
                f.writelines(json.dumps(rec, ensure_ascii=False) + "\n" for rec in recs)
            n += len(recs)
            log.info("T=%g: %d/%d conversations left to run done, %d replies written", temp,
                     min(i + a.batch, len(todo)), len(todo), n)
    print(f"{out}: {n} new replies")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

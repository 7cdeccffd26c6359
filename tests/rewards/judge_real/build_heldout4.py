"""Unlabelled records for ``heldout4.jsonl`` from the base model's held-out evaluation (run by hand).

``PYTHONPATH=. python tests/rewards/judge_real/build_heldout4.py --compare docs/results/rlsta_cpu \\
    --model base --n 320 --out /tmp/heldout4_unlabelled.jsonl``

The replies are the embedded model's own, in the issue-15 comparison (``experiments.compare``,
model ``base``): the held-out problems of ``docs/results/heldout.jsonl`` (templates kept out of
training and of every tuning file), FULL / MT-Add / MT-Refine greedy (T = 0) and FULL / SHARDED at
T = 1 (the LiC runs), 64 new tokens, no system prompt. This script was written, and the round-4
rules frozen (commit e591cb4), before those transcripts existed. Every assistant turn is a
candidate with the user turn it answers and the clean full problem as ``question``; half of the
``n`` come from the greedy evaluation and half from the LiC one, each chosen by the sha256 of its
id, one copy of a repeated text, none that repeats a tuning reply. A labeller then adds ``label``
and ``label_note`` by ``GUIDELINES.md`` without opening the judge's code, tests or outputs.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
from pathlib import Path

from jaxrl_mt.data.loaders import load_tasks_jsonl
from jaxrl_mt.rewards.judge_eval import load_labelled_records
from tests.rewards.judge_real import TUNING_FILES

TEMPERATURE = {"greedy": 0.0, "lic": 1.0}


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def _read(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def candidates(folder: Path, model: str, sub: str, questions: dict[str, str]) -> list[dict]:
    """One record per assistant turn of every conversation of ``folder/models/<model>/<sub>``."""
    wd = folder / "models" / model / sub
    path = next((p for p in (wd / "transcripts.jsonl.gz", wd / "transcripts.jsonl") if p.is_file()), None)
    if path is None:
        raise SystemExit(f"{wd}: no transcripts.jsonl(.gz); run experiments.compare first")
    out = []
    for rec in _read(path):
        for t in rec["turns"]:
            out.append({"id": f"{sub}|{rec['conv_id']}|turn{t['index'] + 1}", "text": t["assistant"],
                        "split": "heldout4", "source": f"heldout_{sub}", "kind": rec["kind"],
                        "turn": t["index"] + 1, "temperature": TEMPERATURE[sub], "task_id": rec["task_id"],
                        "question": questions[rec["task_id"]], "user": t["user"], "max_new_tokens": 64})
    return out


def choose(pool: list[dict], n: int, tuned_texts: set[str]) -> list[dict]:
    """The first ``n`` of ``pool`` by the sha256 of the id: non-empty, new texts, one copy each."""
    seen: set[str] = set()
    chosen = []
    for r in sorted(pool, key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest()):
        key = _norm(r["text"])
        if not key or key in tuned_texts or key in seen:
            continue
        seen.add(key)
        chosen.append(r)
        if len(chosen) == n:
            break
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", default="docs/results/rlsta_cpu", help="the compare output folder")
    ap.add_argument("--model", default="base")
    ap.add_argument("--n", type=int, default=320)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    folder = Path(a.compare)
    questions = {t.task_id: t.full_prompt for t in load_tasks_jsonl(folder / "tasks.jsonl")}
    tuned_texts = {_norm(r["text"]) for p in TUNING_FILES
                   for r in load_labelled_records(p)}
    chosen: list[dict] = []
    for sub in ("greedy", "lic"):
        pool = candidates(folder, a.model, sub, questions)
        part = choose(pool, a.n // 2 + (a.n % 2 if sub == "greedy" else 0), tuned_texts | {_norm(r["text"])
                                                                                         for r in chosen})
        print(f"{sub}: {len(pool)} candidate replies, {len(part)} chosen", file=sys.stderr)
        chosen += part
    with open(a.out, "w", encoding="utf-8") as f:
        for r in sorted(chosen, key=lambda r: r["id"]):
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(chosen)} written to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

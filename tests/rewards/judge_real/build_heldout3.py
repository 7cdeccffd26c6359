"""Unlabelled records for ``heldout3.jsonl`` from a training run's base-model histories (run by hand).

``PYTHONPATH=. python tests/rewards/judge_real/build_heldout3.py --histories runs/rlsta_exp/histories.jsonl \\
    --n 320 --out /tmp/heldout3_unlabelled.jsonl``

``histories.jsonl`` holds the base policy's answered turns of the RLSTA experiment's training
conversations (``configs/rlsta.py:experiment``: the embedded model, ``family:train`` problems as
MT-Add and MT-Refine, T = 0.7, 64 new tokens, no system prompt), written before any update. Every
assistant turn becomes a candidate record with the user turn it answers and the clean full
problem as ``question``; ``n`` of them are chosen by the sha256 of their id (fixed before any
label or judge output is seen), skipping texts that repeat a tuning reply. A labeller then adds
``label`` and ``label_note`` by ``GUIDELINES.md`` without opening the judge's code or tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys

from jaxrl_mt.rewards.judge_eval import load_labelled_records
from tests.rewards.judge_real import ROUND3_TUNING_FILES


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def candidates(path: str, temperature: float, max_new_tokens: int) -> list[dict]:
    """One record per assistant turn of every history in ``path``."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            it = json.loads(line)
            user, turn = "", 0
            for role, content in it["history"]:
                if role == "user":
                    user, turn = content, turn + 1
                    continue
                out.append({"id": f"{it['item_id']}|turn{turn}", "text": content, "split": "heldout3",
                            "source": "family_train_hist", "kind": it["kind"], "turn": turn,
                            "temperature": temperature, "task_id": it["task_id"], "question": it["anchor_prompt"],
                            "user": user, "max_new_tokens": max_new_tokens})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histories", required=True)
    ap.add_argument("--n", type=int, default=320)
    ap.add_argument("--temperature", type=float, default=0.7, help="the histories' sampling temperature")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    tuned_texts = {_norm(r["text"]) for p in ROUND3_TUNING_FILES for r in load_labelled_records(p)}
    tuned_tasks = {r.get("task_id") for p in ROUND3_TUNING_FILES for r in load_labelled_records(p)}
    pool = [r for r in candidates(a.histories, a.temperature, a.max_new_tokens)
            if _norm(r["text"]) not in tuned_texts and r["task_id"] not in tuned_tasks and r["text"].strip()]
    seen: set[str] = set()
    chosen = []
    for r in sorted(pool, key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest()):
        if _norm(r["text"]) in seen:  # one copy of a repeated reply
            continue
        seen.add(_norm(r["text"]))
        chosen.append(r)
        if len(chosen) == a.n:
            break
    with open(a.out, "w", encoding="utf-8") as f:
        for r in sorted(chosen, key=lambda r: r["id"]):
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(pool)} candidate replies, {len(chosen)} written to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

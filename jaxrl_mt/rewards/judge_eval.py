"""Scoring a judge on labelled replies: per-type precision / recall / F1, agreement, the CLI.

``python -m jaxrl_mt.rewards.judge_eval --eval FILE.jsonl [FILE.jsonl ...] [--by source] [--judge local]``
prints the per-type table of the rule-based judge (or of an LLM judge, with its agreement with
the rules) on labelled files of ``{"text": ..., "label": ...}`` lines, and with ``--by FIELD``
the answer-attempt precision / recall per value of a record field.

The embedded model's labelled replies live in the repository, not in the package
(``tests/rewards/judge_real/``, their paths in ``tests.rewards.judge_real``): ``TUNING_FILES``
(``tune.jsonl``, ``heldout.jsonl``, ``heldout2.jsonl``, ``heldout3.jsonl``; each of the last three
was scored once as a held-out set, then became tuning data) are what the rules are tuned on,
cross-validated in 5 folds by problem (:func:`fold_of`); ``HELDOUT4_FILE`` is the fourth
blind-labelled held-out set (replies on the experiment's held-out problems), scored once with the
frozen round-4 rules.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jaxrl_mt.data.jsonl_log import read_jsonl_log
from jaxrl_mt.rewards.judge_rules import RESPONSE_TYPES, classify_rule_based

N_FOLDS = 5  # cross-validation folds, grouped by problem (task_id)


@dataclass(frozen=True)
class TypeScores:
    """Precision and recall of one response type on a labelled set."""

    label: str
    precision: float  # correct predictions / predictions of this type (nan if none predicted)
    recall: float  # correct predictions / gold items of this type (nan if none in gold)
    f1: float  # harmonic mean (0 when both are 0, nan if either is nan)
    support: int  # gold items of this type
    predicted: int  # predictions of this type


def load_labelled_records(path: str, split: str | None = None) -> list[dict]:
    """Reads a labelled JSONL file: objects with ``text`` and ``label`` (and optionally
    ``question``, ``split`` and provenance fields), keeping those of ``split`` when given.

    Raises:
      ValueError: naming file, line and field for a malformed line or an unknown label.
    """
    items = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, Mapping):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            for field in ("text", "label"):
                if not isinstance(record.get(field), str):
                    raise ValueError(f"{path}:{lineno}: field {field!r} missing or not a string")
            if record["label"] not in RESPONSE_TYPES:
                raise ValueError(f"{path}:{lineno}: field 'label' has unknown type {record['label']!r}")
            if split is None or record.get("split") == split:
                items.append(dict(record))
    return items


def load_labelled(path: str) -> list[tuple[str, str]]:
    """``(text, label)`` pairs of a labelled JSONL file (see :func:`load_labelled_records`)."""
    return [(r["text"], r["label"]) for r in load_labelled_records(path)]


def evaluate_labelled(gold: Sequence[str], predicted: Sequence[str]) -> list[TypeScores]:
    """Per-type precision, recall and F1 of predictions against gold labels."""
    if len(gold) != len(predicted):
        raise ValueError(f"evaluate_labelled: {len(gold)} gold labels, {len(predicted)} predicted")
    nan = float("nan")
    scores = []
    for label in RESPONSE_TYPES:
        tp = sum(g == label and p == label for g, p in zip(gold, predicted))
        n_gold = sum(g == label for g in gold)
        n_pred = sum(p == label for p in predicted)
        precision = tp / n_pred if n_pred else nan
        recall = tp / n_gold if n_gold else nan
        if precision != precision or recall != recall:
            f1 = nan
        else:
            f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
        scores.append(TypeScores(label, precision, recall, f1, n_gold, n_pred))
    return scores


def answer_attempt_by(records: Sequence[Mapping], predicted: Sequence[str], field: str) -> dict[str, TypeScores]:
    """Answer-attempt scores per value of ``field`` (e.g. ``source``, ``temperature``, ``kind``)."""
    groups: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        groups.setdefault(str(record.get(field)), []).append(i)
    return {key: evaluate_labelled([records[i]["label"] for i in idx], [predicted[i] for i in idx])[0]
            for key, idx in sorted(groups.items())}


def fold_of(task_id: str, n_folds: int = N_FOLDS) -> int:
    """The cross-validation fold of a problem: sha256 of its ``task_id`` modulo ``n_folds`` (every
    reply of one problem falls in one fold; fixed before any error was read)."""
    return int(hashlib.sha256(task_id.encode("utf-8")).hexdigest(), 16) % n_folds


def answer_attempt_by_fold(records: Sequence[Mapping], predicted: Sequence[str],
                           n_folds: int = N_FOLDS) -> list[TypeScores]:
    """Answer-attempt scores on each fold (:func:`fold_of` of the record's ``task_id``)."""
    folds = [fold_of(str(r["task_id"]), n_folds) for r in records]
    return [evaluate_labelled([r["label"] for r, f in zip(records, folds) if f == k],
                              [p for p, f in zip(predicted, folds) if f == k])[0] for k in range(n_folds)]


def mean_over_folds(per_fold: Sequence[TypeScores]) -> tuple[float, float]:
    """The mean answer-attempt precision and recall over folds (a fold without predictions or gold
    answer attempts is left out of that mean)."""
    ps = [s.precision for s in per_fold if s.precision == s.precision]
    rs = [s.recall for s in per_fold if s.recall == s.recall]
    return sum(ps) / len(ps), sum(rs) / len(rs)


def format_table(scores: Sequence[TypeScores]) -> str:
    """A plain-text table of per-type scores with a macro-averaged last row."""
    rows = [f"{'type':<16}{'precision':>10}{'recall':>8}{'f1':>7}{'support':>9}{'predicted':>10}"]
    for s in scores:
        rows.append(
            f"{s.label:<16}{s.precision:>10.3f}{s.recall:>8.3f}{s.f1:>7.3f}"
            f"{s.support:>9d}{s.predicted:>10d}"
        )
    present = [s for s in scores if s.support]
    keys = ("precision", "recall", "f1")
    macro = [sum(getattr(s, k) for s in present) / len(present) for k in keys]
    rows.append(
        f"{'macro':<16}{macro[0]:>10.3f}{macro[1]:>8.3f}{macro[2]:>7.3f}"
        f"{sum(s.support for s in scores):>9d}{sum(s.predicted for s in scores):>10d}"
    )
    return "\n".join(rows)


def macro_f1(scores: Sequence[TypeScores]) -> float:
    """Mean F1 over types present in the gold labels (an undefined F1 counts as 0)."""
    present = [s for s in scores if s.support]
    return sum(0.0 if s.f1 != s.f1 else s.f1 for s in present) / len(present)


def llm_predictions(items: Sequence[Mapping], classify, path: str | None, chunk: int) -> list[str]:
    """``classify`` over ``items`` ``chunk`` at a time, each finished chunk appended to ``path``.

    A rerun keeps the labels already in ``path`` (matched in order by the item's text; a last line
    cut by a kill is dropped and cut from the file, `data.jsonl_log`) and classifies only the
    rest, so an LLM judge that is slow on CPU can be stopped and resumed.

    Raises:
      ValueError: ``path`` holds labels of other items (another ``--eval`` / ``--every``), or an
        unreadable line before its last.
    """
    done: list[str] = []
    if path is not None:
        for k, (n, rec) in enumerate(read_jsonl_log(path, repair=True)):
            if k >= len(items) or rec.get("text") != items[k]["text"]:
                raise ValueError(f"{path}: line {n} is not the label of item {k + 1} of this --eval; "
                                 "use another --predictions file")
            done.append(rec["predicted"])
    for lo in range(len(done), len(items), chunk):
        block = items[lo:lo + chunk]
        got = classify(block)
        done += got
        if path is not None:
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(json.dumps({"text": r["text"], "predicted": p}) + "\n" for r, p in zip(block, got))
        print(f"LLM judge: {len(done)}/{len(items)} classified", file=sys.stderr, flush=True)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", required=True, nargs="+", metavar="FILE", help="labelled JSONL file(s)")
    parser.add_argument("--split", default=None, help="only records of this split (tune | heldout)")
    parser.add_argument("--domain", default="math", help="task domain for the rules")
    parser.add_argument("--judge", default="rule", help="rule, or an LLM judge: local | local:MODEL | http:URL#MODEL")
    parser.add_argument("--by", default=None, metavar="FIELD", help="answer-attempt P / R per value of FIELD")
    parser.add_argument("--errors", action="store_true", help="also print misclassified items")
    parser.add_argument("--every", type=int, default=1, metavar="K", help="only every K-th labelled item")
    parser.add_argument("--predictions", default=None, metavar="OUT.jsonl",
                        help="LLM judge: append its labels here chunk by chunk; a rerun resumes from the file")
    parser.add_argument("--chunk", type=int, default=16, help="LLM judge: replies per call")
    args = parser.parse_args(argv)
    if args.every < 1 or args.chunk < 1:
        parser.error(f"--every and --chunk must be >= 1, got {args.every}, {args.chunk}")
    items = [r for path in args.eval for r in load_labelled_records(path, args.split)][::args.every]
    gold = [r["label"] for r in items]
    rules = [classify_rule_based(r["text"], args.domain, question=r.get("question"), user=r.get("user")) for r in items]
    predicted = rules
    if args.judge != "rule":
        from jaxrl_mt.backends import make_backend
        from jaxrl_mt.rewards.judge_llm import classify_llm

        stats: dict[str, int] = {}
        backend = make_backend(args.judge)

        def classify(block: Sequence[Mapping]) -> list[str]:
            questions = [r.get("question") or "(not shown)" for r in block]
            return classify_llm(backend, [r["text"] for r in block], questions, domain=args.domain, stats=stats)

        predicted = llm_predictions(items, classify, args.predictions, args.chunk)
        agree = sum(a == b for a, b in zip(predicted, rules)) / len(items)
        print(f"LLM judge {args.judge}: agreement with the rule-based judge {agree:.3f} on {len(items)} items "
              f"(verdicts of this run {stats})")
    scores = evaluate_labelled(gold, predicted)
    print(format_table(scores))
    print(f"macro-F1 {macro_f1(scores):.3f}, accuracy "
          f"{sum(g == p for g, p in zip(gold, predicted)) / len(gold):.3f} on {len(gold)} items")
    if args.by:
        for key, aa in answer_attempt_by(items, predicted, args.by).items():
            print(f"answer_attempt {args.by}={key}: precision {aa.precision:.3f} recall {aa.recall:.3f} "
                  f"f1 {aa.f1:.3f} (gold {aa.support}, predicted {aa.predicted})")
    if args.errors:
        for r, p in zip(items, predicted):
            if r["label"] != p:
                print(f"[{r['label']} -> {p}] {r['text']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Leave-one-fold-out estimate of the round-3 rule changes (run by hand; not a test).

``PYTHONPATH=. python tests/rewards/judge_real/cv_round3.py [--ablate]``

All 785 labelled replies (``tests.rewards.judge_real.ROUND3_TUNING_FILES``) fall in 5 folds by problem
(``judge_eval.fold_of``: sha256 of the task_id mod 5, fixed before any error was read). Each rule
added in round 3 is listed in ``CHANGES`` with the folds whose errors motivated it (only errors
of folds 0-3 were read; fold 4 was never read). The rules judging fold k are the final rules
with every change motivated by fold k switched back off (its old behaviour patched in), so no
fold is judged by a rule written from its own errors; the estimate is the mean over folds of
answer-attempt P / R on the unseen fold, plus the pooled out-of-fold predictions by source,
temperature and type. Removals are in every fold's rules (they were decided by how many
problems a rule fires on, not by any fold's errors).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from contextlib import ExitStack, contextmanager

from jaxrl_mt.rewards import judge_eval as E
from jaxrl_mt.rewards import judge_rules as J
from jaxrl_mt.rewards import judge_rules_asked as A
from tests.rewards.judge_real import ROUND3_TUNING_FILES
from jaxrl_mt.rewards import judge_rules_math as M

_OLD_ENDS_ON_VALUE_RE = re.compile(
    r"(?:=|\b(?:is|are|was|were|has|have|had|gives?|equals?|total\s+of)|:)\s*[$\u00a3\u20ac]?\d[\d,.]*(?:\s?%)?"
    r"(?:\s+[A-Za-z'-]+){0,4}\W*$", re.IGNORECASE)
_OLD_STATE_RE = re.compile(
    r"\b(?:has|have|had|holds?|held|contains?|costs?|owns?|makes?|left|remain(?:s|ing)?|"
    r"now|total|altogether|in\s+all|at\s+the\s+end|end(?:s|ed)?\s+(?:up\s+)?with|there\s+(?:are|is|were|was))\b"
    r"|\b(?:is|are|was|were)\b(?!\s+\w+ing\b)", re.IGNORECASE)


# change -> (folds whose errors motivated it, [(module, attribute, old value)]). Three more were
# tried and dropped, as their out-of-fold effect was negative (fixed 0-1, broke 1-3 replies of
# the folds they were not written from): the counted noun after a modifier ("How many white
# tiles"), a sole value statement counted as the whole when a total is asked, and a cut-off
# conclusion opener ("So, Emma has") announcing the result just computed.
CHANGES: dict[str, tuple[set[int], list[tuple[object, str, object]]]] = {
    "asked verb": ({0, 1, 2}, [(M, "_answers_in_asked_verb", lambda s, v, a: False),
                               (M, "_is_asked_verb", lambda w, a: A.stem(w) in a.words)]),
    "fragment ends on value after adverb": ({1}, [(M, "_ENDS_ON_VALUE_RE", _OLD_ENDS_ON_VALUE_RE)]),
    "contracted state": ({1}, [(M, "_STATE_RE", _OLD_STATE_RE)]),
    "label names the asked": ({2}, [(M, "_labels_asked_value", lambda s, a: bool(M._KEY_VALUE_RE.match(s)))]),
}


@contextmanager
def _patched(patches: list[tuple[object, str, object]]):
    with ExitStack() as stack:
        for mod, attr, value in patches:
            old = getattr(mod, attr)
            setattr(mod, attr, value)
            stack.callback(setattr, mod, attr, old)
        yield


def _predict(recs: list[dict]) -> list[str]:
    return [J.classify_rule_based(r["text"], "math", question=r.get("question"), user=r.get("user")) for r in recs]


def out_of_fold(recs: list[dict], off: Callable[[int], list[str]]) -> list[str]:
    """Predictions of each record by the rules with the changes ``off(fold)`` switched off."""
    pred: list[str] = [""] * len(recs)
    for k in range(E.N_FOLDS):
        idx = [i for i, r in enumerate(recs) if E.fold_of(r["task_id"]) == k]
        patches = [p for name in off(k) for p in CHANGES[name][1]]
        with _patched(patches):
            for i, p in zip(idx, _predict([recs[i] for i in idx])):
                pred[i] = p
    return pred


def report(recs: list[dict], pred: list[str], name: str) -> None:
    """Prints the fold means and the pooled breakdowns of ``pred``."""
    per_fold = E.answer_attempt_by_fold(recs, pred)
    p, r = E.mean_over_folds(per_fold)
    folds = " ".join(f"f{k} {s.precision:.3f}/{s.recall:.3f}" for k, s in enumerate(per_fold))
    print(f"{name}: mean over folds AA P {p:.3f} R {r:.3f}  [{folds}]")
    for field in ("source", "temperature", "split", "kind"):
        cells = E.answer_attempt_by(recs, pred, field)
        print("  " + field + ": " + ", ".join(f"{k} {s.precision:.2f}/{s.recall:.2f} (g{s.support})"
                                             for k, s in cells.items()))
    scores = E.evaluate_labelled([x["label"] for x in recs], pred)
    print("  types F1: " + ", ".join(f"{s.label} {s.f1:.2f} (g{s.support}/p{s.predicted})" for s in scores)
          + f"; macro-F1 {E.macro_f1(scores):.3f}")


def main() -> None:
    """Prints the estimate with all changes, the out-of-fold estimate, and (``--ablate``) each change's effect."""
    recs = [json.loads(line) for f in ROUND3_TUNING_FILES for line in open(f, encoding="utf-8") if line.strip()]
    report(recs, out_of_fold(recs, lambda k: list(CHANGES)), "round-3 removals only")
    report(recs, _predict(recs), "all changes, fit on all data")
    report(recs, out_of_fold(recs, lambda k: [n for n, (m, _) in CHANGES.items() if k in m]),
           "leave-one-fold-out (CV estimate)")
    if "--ablate" in sys.argv:
        base = E.mean_over_folds(E.answer_attempt_by_fold(recs, _predict(recs)))
        for name in CHANGES:
            pred = out_of_fold(recs, lambda k, n=name: [n])
            p, r = E.mean_over_folds(E.answer_attempt_by_fold(recs, pred))
            print(f"without {name!r}: P {p:.3f} ({p - base[0]:+.3f}) R {r:.3f} ({r - base[1]:+.3f})")


if __name__ == "__main__":
    main()

"""Pure functions of LiC transcript records (``jaxrl_mt.eval.simulator.transcript_record``).

Everything the experiment reports is computed here from the stored replies, re-extracting and
re-verifying the answers with ``jaxrl_mt.rewards.verifier`` (not the per-turn verdicts stored at
evaluation time), so a report rebuilt from the files always uses one verifier for every model.

Accuracy of a conversation = the verifier on its *last* reply (judge-free). Per problem the
accuracy is the mean over its runs; an aggregate is the mean over problems. Confidence intervals
are percentile bootstraps over problems; differences between two models (or two scenarios of one
model) are *paired*: each replicate resamples problems and takes both sides of the same problems.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_mt.eval.metrics import percentile_ci
from jaxrl_mt.rewards.judge_rules import NON_ANSWER_TYPES
from jaxrl_mt.rewards.verifier import extract_answer, verify

__all__ = ["CI_LEVEL", "bootstrap_mean", "bootstrap_paired", "bootstrap_ratio", "early_turn_shares", "family_of",
           "final_reply_lengths", "first_answer_turns", "inertia", "last_reply_scores", "pass_at_k", "pass_hat_k",
           "pass_k_scores", "response_types_per_turn", "restates_user", "uncut_scores"]

CI_LEVEL = 0.95
ECHO_SHARE = 0.8  # a reply with at least this share of its words in the user's message restates it
_WORD = re.compile(r"[a-z0-9]+")  # a word of lower-cased text, for `restates_user`
Record = Mapping[str, Any]


def family_of(task_id: str) -> str:
    """The problem family of a task id: ``family/heldout/1/...`` -> ``heldout1``; else its first part."""
    parts = task_id.split("/")
    if parts[0] == "family" and len(parts) > 2:
        return parts[1] + parts[2]
    return parts[0]


def _last_reply_values(records: Iterable[Record], kind: str, value: Callable[[Record], Sequence[float] | None],
                       keep: Callable[[str], bool] | None = None) -> dict[str, list[Sequence[float]]]:
    """Task id -> ``value(record)`` of each of its runs (None skips the record), taking the records of
    one kind with at least one turn whose task passes `keep`."""
    runs: dict[str, list[Sequence[float]]] = defaultdict(list)
    for r in records:
        if r["kind"] != kind or (keep is not None and not keep(r["task_id"])) or not r["turns"]:
            continue
        v = value(r)
        if v is not None:
            runs[r["task_id"]].append(v)
    return dict(sorted(runs.items()))


def _last_reply_means(records: Iterable[Record], kind: str, value: Callable[[Record], Sequence[float] | None],
                      keep: Callable[[str], bool] | None = None) -> dict[str, list[float]]:
    """Task id -> per-column means over its runs of ``value(record)`` (see `_last_reply_values`)."""
    runs = _last_reply_values(records, kind, value, keep)
    return {t: [float(np.mean(col)) for col in zip(*v)] for t, v in runs.items()}


def last_reply_scores(records: Iterable[Record], kind: str, mode: str = "strict",
                      keep: Callable[[str], bool] | None = None) -> dict[str, float]:
    """Task id -> mean over its runs of the verifier on the conversation's last reply.

    Args:
      records: transcript records.
      kind: the scenario kind to take (``full``, ``sharded``, ``mt_refine``, ...).
      mode: verifier mode (``strict`` | ``lenient``).
      keep: optional filter on task ids.
    """
    means = _last_reply_means(records, kind, lambda r: (float(verify(r["turns"][-1]["assistant"], r["gold"], mode)),),
                              keep)
    return {t: m[0] for t, m in means.items()}


def _quantiles(reps: np.ndarray) -> tuple[float, float]:
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(reps, [100 * (1 - CI_LEVEL) / 2, 100 * (1 + CI_LEVEL) / 2], method="linear")
    return float(lo), float(hi)


def bootstrap_mean(scores: Mapping[str, float], *, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """Mean over problems and its percentile-bootstrap CI: ``{"mean", "lo", "hi", "n"}`` (0-1 scale)."""
    v = np.array([scores[k] for k in sorted(scores)], np.float64)
    if v.size == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    lo, hi = percentile_ci(v, n_boot, 1 - CI_LEVEL, seed)
    return {"mean": float(v.mean()), "lo": lo, "hi": hi, "n": int(v.size)}


def _paired(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    common = sorted(set(a) & set(b))
    return np.array([a[k] for k in common], np.float64), np.array([b[k] for k in common], np.float64)


def bootstrap_paired(a: Mapping[str, float], b: Mapping[str, float], *, n_boot: int = 1000,
                     seed: int = 0) -> dict[str, float]:
    """Paired difference ``mean(b) - mean(a)`` over the problems both hold, with its bootstrap CI.

    Returns:
      ``{"diff", "lo", "hi", "n", "excludes_zero"}`` (0-1 scale).
    """
    x, y = _paired(a, b)
    if x.size == 0:
        return {"diff": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0, "excludes_zero": False}
    lo, hi = percentile_ci(y - x, n_boot, 1 - CI_LEVEL, seed)
    return {"diff": float((y - x).mean()), "lo": lo, "hi": hi, "n": int(x.size),
            "excludes_zero": bool(lo > 0 or hi < 0)}


def bootstrap_ratio(multi: Mapping[str, float], single: Mapping[str, float], *, n_boot: int = 1000,
                    seed: int = 0) -> dict[str, float]:
    """The LiC score ``mean(multi) / mean(single)`` over common problems, CI by paired bootstrap.

    Replicates with a zero single-turn mean are dropped from the CI; the ratio itself is nan
    when the single-turn mean is 0.
    """
    m, s = _paired(multi, single)
    if m.size == 0 or s.mean() == 0:
        return {"ratio": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": int(m.size)}
    idx = np.random.default_rng(seed).integers(0, m.size, size=(n_boot, m.size))
    den = s[idx].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = np.where(den > 0, m[idx].mean(axis=1) / np.where(den > 0, den, 1.0), np.nan)
    lo, hi = _quantiles(reps)
    return {"ratio": float(m.mean() / s.mean()), "lo": lo, "hi": hi, "n": int(m.size)}


def inertia(records: Iterable[Record], kinds: Sequence[str] | None = None) -> dict[str, Any]:
    """Contextual inertia: among final answers given after an earlier wrong answer in the same
    conversation, the share that repeat an earlier wrong number.

    A conversation counts when an earlier reply (not the last) has an extracted answer that is
    wrong (strict) and the last reply has an extracted answer. It repeats when the last answer
    equals one of the earlier wrong answers (normalised numbers).

    Returns:
      ``{"n_eligible", "n_repeat", "share", "repeat_flags"}`` (flags per eligible conversation,
      in record order, for bootstrapping) and ``"last_correct_share"`` (eligible conversations
      whose last answer is right).
    """
    flags, right = [], []
    for r in records:
        if (kinds is not None and r["kind"] not in kinds) or len(r["turns"]) < 2:
            continue
        wrong = set()
        for t in r["turns"][:-1]:
            a = extract_answer(t["assistant"])
            if a is not None and not verify(t["assistant"], r["gold"], "strict"):
                wrong.add(a)
        last = r["turns"][-1]["assistant"]
        final = extract_answer(last)
        if not wrong or final is None:
            continue
        flags.append(final in wrong)
        right.append(bool(verify(last, r["gold"], "strict")))
    n = len(flags)
    return {"n_eligible": n, "n_repeat": int(sum(flags)), "share": (sum(flags) / n) if n else float("nan"),
            "last_correct_share": (sum(right) / n) if n else float("nan"), "repeat_flags": [int(f) for f in flags]}


def response_types_per_turn(records: Iterable[Record], kind: str) -> dict[int, dict[str, int]]:
    """1-based turn -> judge label -> count, over the conversations of one scenario kind."""
    out: dict[int, Counter] = defaultdict(Counter)
    for r in records:
        if r["kind"] != kind:
            continue
        for k, t in enumerate(r["turns"]):
            out[k + 1][t.get("label", "unknown")] += 1
    return {k: dict(sorted(c.items())) for k, c in sorted(out.items())}


def first_answer_turns(records: Iterable[Record], kind: str) -> list[int | None]:
    """Per conversation of one kind, the 1-based turn of the judge's first answer attempt (or None)."""
    return [next((k + 1 for k, t in enumerate(r["turns"]) if t.get("answer_attempt")), None)
            for r in records if r["kind"] == kind]


def early_turn_shares(records: Iterable[Record], kind: str = "sharded") -> dict[str, dict[str, float]]:
    """ICPO's view of the turns before the last (in MT-Add not every condition is given yet there): per
    task (mean over runs of each conversation's share over those turns), the share of replies the judge
    labelled a non-answer (``NON_ANSWER_TYPES``: clarification, interrogation, discussion, hedging,
    refusal) and the share labelled an answer attempt: ``{"non_answer": {task: 0-1}, "answer": {...}}``.
    One-turn conversations are skipped."""

    def value(r: Record) -> tuple[float, float] | None:
        early = [t.get("label") for t in r["turns"][:-1]]
        if not early:
            return None
        return (sum(lab in NON_ANSWER_TYPES for lab in early) / len(early),
                sum(lab == "answer_attempt" for lab in early) / len(early))

    means = _last_reply_means(records, kind, value)
    return {f: {t: m[i] for t, m in means.items()} for i, f in enumerate(("non_answer", "answer"))}


def restates_user(user: str, reply: str, share: float = ECHO_SHARE) -> bool:
    """Whether `reply` only restates the user's message: it states no number the message lacks and at
    least `share` of its words (lower-cased runs of letters and digits) occur in the message.
    "Later, 5 more cars drive in." restates "Later, 5 more cars drive in."; "There are 14 cars." and
    "Sven's final score is 100." (to "What is Sven's final score?") do not. An empty reply restates nothing."""
    words = _WORD.findall(reply.lower())
    if not words:
        return False
    given = set(_WORD.findall(user.lower()))
    if any(w not in given for w in words if w.isdigit()):
        return False
    return sum(w in given for w in words) >= share * len(words)


def final_reply_lengths(records: Iterable[Record], kind: str) -> dict[str, dict[str, float]]:
    """Per task (mean over runs) of one kind, the last reply's new tokens, whether the reply budget
    cut it (``finish_reason == "length"``) and whether it only restates the last user message
    (`restates_user`): ``{"tokens": {task: n}, "cut": {task: 0-1}, "echo": {task: 0-1}}``.
    Conversations whose last turn records no ``new_tokens`` are skipped."""

    def value(r: Record) -> tuple[float, float, float] | None:
        cut, last = _cut(r), r["turns"][-1]
        if cut is None:
            return None
        echo = restates_user(last.get("user") or "", last.get("assistant") or "")
        return float(last["new_tokens"]), float(cut), float(echo)

    means = _last_reply_means(records, kind, value)
    return {f: {t: m[i] for t, m in means.items()} for i, f in enumerate(("tokens", "cut", "echo"))}


def _cut(r: Record) -> bool | None:
    """Whether the reply budget cut the conversation's last reply (None: its length is not recorded)."""
    last = r["turns"][-1]
    return None if last.get("new_tokens") is None else last.get("finish_reason") == "length"


def uncut_scores(records: Iterable[Record], kind: str, mode: str = "strict") -> dict[str, float]:
    """`last_reply_scores` over the conversations whose last reply the budget did not cut (the complement
    of `final_reply_lengths`'s ``cut``; conversations that record no length are skipped, as there).
    A task all of whose runs were cut is absent."""
    def value(r: Record) -> tuple[float] | None:
        return None if _cut(r) is not False else (float(verify(r["turns"][-1]["assistant"], r["gold"], mode)),)

    return {t: m[0] for t, m in _last_reply_means(records, kind, value).items()}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` of ``n`` runs correct: the chance that at least one of
    ``k`` runs drawn without replacement is correct, ``1 - C(n - c, k) / C(n, k)``."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k (tau-bench) of one problem with ``c`` of ``n`` runs correct: the chance that all
    ``k`` runs drawn without replacement are correct, ``C(c, k) / C(n, k)``."""
    return math.comb(c, k) / math.comb(n, k)


def pass_k_scores(records: Iterable[Record], kind: str, mode: str = "strict") -> dict[str, dict[int, dict[str, float]]]:
    """Per-problem pass@k and pass^k of one kind, a run being correct when the verifier accepts its last
    reply (so pass@1 = pass^1 = `last_reply_scores`), for k = 1 .. the most runs of a problem.

    Returns:
      ``{"pass@k": {k: {task: v}}, "pass^k": {k: {task: v}}}``; a problem with fewer than k runs is
      absent at k.
    """
    runs = _last_reply_values(records, kind, lambda r: (float(verify(r["turns"][-1]["assistant"], r["gold"], mode)),))
    counts = {t: (len(v), int(sum(x[0] for x in v))) for t, v in runs.items()}
    ks = range(1, max((n for n, _ in counts.values()), default=0) + 1)
    return {name: {k: {t: f(n, c, k) for t, (n, c) in counts.items() if n >= k} for k in ks}
            for name, f in (("pass@k", pass_at_k), ("pass^k", pass_hat_k))}

"""RLSTA training items: multi-turn histories answered by the policy, and latent-capability filtering.

Stage 1 (histories): for every training scenario (MT-Add or MT-Refine), the history model answers
every user turn but the last (`run_conversations`, each conversation's KV cache kept in a slot).
Stage 2 (filtering): k single-turn samples on the clean full prompt against k re-samples of the
last turn given the history; a history is kept when single-turn accuracy > multi-turn accuracy
(the model "knows" the answer but loses it in conversation), at most `cap` per problem.
Both stages are seeded and cached as JSONL with their statistics.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.conversations import ConversationRun, run_conversations
from jaxrl_mt.data.records import Scenario
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.sampling import Sampler, SamplingConfig


@dataclasses.dataclass(frozen=True)
class TrainItem:
    """One RLSTA training prompt: a history plus its final user turn."""

    item_id: str  # "<task_id>|<kind>|<history index>"
    task_id: str  # problem id (for the per-problem cap)
    kind: str  # scenario kind ("sharded" = MT-Add, "mt_refine")
    history: tuple[tuple[str, str], ...]  # ((role, content), ...) answered turns
    last_user: str  # the final user turn (the rollout prompt ends with it)
    anchor_prompt: str  # clean full single-turn prompt (anchor reward context)
    merged_user: str  # all user turns joined (the alternative anchor context)
    answer: str  # gold answer
    st_acc: float = float("nan")  # single-turn accuracy over k samples (filtering)
    mt_acc: float = float("nan")  # multi-turn accuracy over k samples (filtering)

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.history] + [{"role": "user", "content": self.last_user}]

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["history"] = [list(x) for x in self.history]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TrainItem":
        d = dict(d)
        d["history"] = tuple(tuple(x) for x in d["history"])
        return cls(**d)


def build_histories(sampler: Sampler, scenarios: Sequence[Scenario], sampling: SamplingConfig, *,
                    seed: int, system: str | None = None) -> list[TrainItem]:
    """Answers every turn but the last of each scenario (KV caches kept across turns)."""
    runs = [ConversationRun(conv_id=f"{s.task_id}|{s.kind}|0", system=system, user_turns=list(s.turns[:-1]),
                            meta={"i": i}) for i, s in enumerate(scenarios)]
    run_conversations(sampler, runs, sampling, seed=seed, reuse_cache=True)  # no re-prefill of the history
    items = []
    for r, s in zip(runs, scenarios):
        hist = tuple((m["role"], m["content"]) for m in r.messages)
        items.append(TrainItem(item_id=r.conv_id, task_id=s.task_id, kind=s.kind, history=hist,
                               last_user=s.turns[-1], anchor_prompt=s.anchor_prompt,
                               merged_user="\n".join(s.turns), answer=s.answer))
    return items


def single_and_multi_texts(sampler: Sampler, items: Sequence[TrainItem], sampling: SamplingConfig, *, k: int,
                           seed: int, system: str | None = None, first: int = 0,
                           total: int | None = None) -> tuple[list[str], list[str]]:
    """k samples per item on the full single-turn prompt and on history + last turn (one call).

    The k samples of a prompt are one group of `generate_ids` (the prompt prefilled once for its k
    rows): the rows and their seeds are those of passing each prompt k times. ``items`` are items
    ``[first, first + len(items))`` of ``total`` (default: all of them): each row draws with the seed
    it has in the call over all ``total`` (the single-turn rows, then the multi-turn rows), so a
    block sampled alone (a process's share, ``rl.multiturn.per_process``) draws what the whole does.
    """
    tok = sampler.tokenizer
    st = [encode_prompt(tok, [{"role": "user", "content": it.anchor_prompt}], system=system) for it in items]
    mt = [encode_prompt(tok, it.messages, system=system) for it in items]
    total = len(items) if total is None else total
    st_seeds = np.arange(first * k, (first + len(items)) * k)
    texts = sampler.generate_ids(st + mt, sampling, seed=seed, group_size=k,
                                 row_seeds=np.concatenate([st_seeds, st_seeds + total * k])).texts
    n = len(items) * k
    return texts[:n], texts[n:]


def accuracy_single_and_multi(sampler: Sampler, items: Sequence[TrainItem], sampling: SamplingConfig, *, k: int,
                              seed: int, system: str | None = None, modes: Sequence[str] = ("strict",),
                              first: int = 0, total: int | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """k-sample accuracy [N] on the full single-turn prompt and on history + last turn, per verifier mode
    (``first``, ``total``: as ``single_and_multi_texts``)."""
    st_t, mt_t = single_and_multi_texts(sampler, items, sampling, k=k, seed=seed, system=system, first=first,
                                        total=total)
    golds = [it.answer for it in items for _ in range(k)]
    n = len(items)
    out = {}
    for mode in modes:
        st = np.array([verify(t, g, mode) for t, g in zip(st_t, golds)], np.float64).reshape(n, k).mean(1)
        mt = np.array([verify(t, g, mode) for t, g in zip(mt_t, golds)], np.float64).reshape(n, k).mean(1)
        out[mode] = (st, mt)
    return out


def filter_items(items: Sequence[TrainItem], st_acc: np.ndarray, mt_acc: np.ndarray, *, cap: int,
                 seed: int) -> tuple[list[TrainItem], dict[str, float]]:
    """Keeps items with st_acc > mt_acc, at most `cap` per problem (seeded choice)."""
    rng = np.random.default_rng(seed)
    scored = [dataclasses.replace(it, st_acc=float(s), mt_acc=float(m)) for it, s, m in zip(items, st_acc, mt_acc)]
    by_task: dict[str, list[TrainItem]] = collections.defaultdict(list)
    for it in scored:
        if it.st_acc > it.mt_acc:
            by_task[it.task_id].append(it)
    kept: list[TrainItem] = []
    for tid in sorted(by_task):
        cands = by_task[tid]
        order = rng.permutation(len(cands))[:cap]
        kept += [cands[i] for i in sorted(order)]
    stats = {"n_items": len(scored), "n_kept": len(kept),
             "st_acc_mean": float(np.mean(st_acc)) if len(st_acc) else float("nan"),
             "mt_acc_mean": float(np.mean(mt_acc)) if len(mt_acc) else float("nan"),
             "keep_rate": len(kept) / max(len(scored), 1)}
    return kept, stats


def save_items(path: str | os.PathLike, items: Sequence[TrainItem], stats: dict[str, Any]) -> None:
    """Writes items as JSONL plus a `<path>.stats.json`, atomically."""
    p = Path(path)
    tmp = p.with_suffix(p.suffix + ".tmp")
    with open(tmp, "w") as f:
        for it in items:
            f.write(json.dumps(it.to_json()) + "\n")
    os.replace(tmp, p)
    Path(str(p) + ".stats.json").write_text(json.dumps(stats, indent=2))


def load_items(path: str | os.PathLike) -> list[TrainItem]:
    """Reads items written by save_items."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(TrainItem.from_json(json.loads(line)))
                except (json.JSONDecodeError, TypeError, KeyError) as e:
                    raise ValueError(f"{path}:{n}: bad training item ({e})") from None
    return out


def texts_key(items: Sequence[TrainItem], **settings: Any) -> dict[str, Any]:
    """What the filter's texts depend on: the sampling ``settings`` and a digest of the items."""
    digest = hashlib.sha256()
    for it in items:
        digest.update(json.dumps(it.to_json(), sort_keys=True).encode() + b"\n")
    return {**settings, "n_items": len(items), "items_sha256": digest.hexdigest()}


def save_texts(path: str | os.PathLike, key: dict[str, Any], items: Sequence[TrainItem], st: Sequence[str],
               mt: Sequence[str], *, k: int) -> None:
    """Writes ``single_and_multi_texts``' output as JSONL (a ``{"key"}`` line, then one line per item), atomically."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps({"key": key}) + "\n")
        for i, it in enumerate(items):
            f.write(json.dumps({"item_id": it.item_id, "st": list(st[i * k:(i + 1) * k]),
                                "mt": list(mt[i * k:(i + 1) * k])}) + "\n")
    os.replace(tmp, p)


def load_texts(path: str | os.PathLike, key: dict[str, Any], items: Sequence[TrainItem], *, k: int
               ) -> tuple[list[str], list[str]] | None:
    """The texts ``save_texts`` wrote for the same ``key`` (``None`` when the key differs: stale).

    Raises:
      ValueError: a damaged file (naming its line): bad JSON, a wrong item id or sample count.
    """
    data = Path(path).read_bytes()
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 (byte {e.start})") from None
    try:
        if json.loads(lines[0])["key"] != key:
            return None
    except (IndexError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}:1: not a filter texts header ({type(e).__name__}: {e})") from None
    if len(lines) != len(items) + 1:
        raise ValueError(f"{path}:{len(lines)}: {len(lines) - 1} item lines for {len(items)} items")
    st: list[str] = []
    mt: list[str] = []
    for n, (line, it) in enumerate(zip(lines[1:], items), 2):
        try:
            d = json.loads(line)
            ok = d["item_id"] == it.item_id and len(d["st"]) == len(d["mt"]) == k
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: bad filter texts line ({type(e).__name__}: {e})") from None
        if not ok:
            raise ValueError(f"{path}:{n}: expected item {it.item_id!r} with {k} + {k} texts")
        st += d["st"]
        mt += d["mt"]
    return st, mt

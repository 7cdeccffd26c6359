"""SeDT: a training-free fix for multi-turn conversations (inference only).

Before the final turn, the flat history of user turns is rewritten as annotated tuples
``(return-to-go, label, shard)`` that tell the model which past turns matter; a weak
conversation's answer is then checked by a second ("verifier") call and replaced only when the
correction demonstrably covers more of the confirmed content.

The math (pure functions, one conversation of T user turns):

- ``sem[t]`` = (cos(e_t, e_anchor) + 1) / 2 with e = pooled hidden states of the project's scorer
  (``jaxrl_mt.scoring.embed_texts``, the same ``Scorer.score`` the RLSTA anchor reward uses), or
  max(cos, 0) with ``sem_map="clip"``. The anchor is a task-typed goal sentence (per domain).
- ``lex[t]`` = Jaccard overlap of content words (lower-cased words and numbers, stop words removed)
  of turn t and the anchor.
- ``pos[t]`` = 1 - |t - c| / (c + 1), c = (T - 1) / 2: an inverted U, 1 at the middle turn and
  symmetric about it (T=5: 1/3, 2/3, 1, 2/3, 1/3; T=1: 1).
- ``rel[t]`` = w_sem sem + w_lex lex + w_pos pos (weights >= 0 summing to 1, so rel is in [0, 1]);
  then the last-shard guarantee rel[T-1] = max(rel[T-1], last_shard_floor).
- ``rtg[t]`` = sum_{s >= t} rel[s] (non-increasing in t); label CONFIRMED iff rel[t] > mean(rel),
  else UNCERTAIN.

Prompt format of the final turn (``format_prompt``; the final user message the model sees, the
history itself is left out unless ``keep_history``)::

    Here is everything I told you, one message per line as (return-to-go, label, message).
    Return-to-go is how relevant that message and all later ones are to the task (higher
    means more); CONFIRMED messages are key facts, UNCERTAIN ones may matter less.
    (2.41, CONFIRMED, "How many clips did Natalia sell altogether in April and May?")
    (1.62, UNCERTAIN, "Natalia sold clips to 48 of her friends in April.")
    (0.80, CONFIRMED, "She sold half as many clips in May.")
    Task: Compute the final numeric answer to the word problem. Use every CONFIRMED message.
    Solve it step by step and end with "The answer is <number>."

Each line is ``(rtg with 2 decimals, LABEL, message as a JSON string)``, in conversation order.

Self-correction: triggered when the final shard is weak (rel[T-1] / max(rel) < trigger_last_rel)
or most turns are uncertain (fraction UNCERTAIN > trigger_uncertain_frac), and only when the
CONFIRMED turns have content words. A verifier prompt (``correction_prompt``) writes a new
answer; the guard (``guard_replace``, mode ``SeDTConfig.guard``) decides whether it replaces the
original:

- ``"no_answer"`` (default): only if the original holds no number at all
  (``jaxrl_mt.rewards.verifier.find_numbers`` finds none), the correction holds one, and the
  correction's coverage of CONFIRMED content words is strictly larger than the original's.
- ``"coverage"`` (the method's rule, kept as an ablation): only the coverage condition.

A "hurt case" is a replacement that is wrong where the original was right. Under the default
guard it is impossible by construction: a response without a number scores 0 under the strict
and the lenient verifier for every gold answer, so the replaced answer was already wrong (see
:func:`guard_replace`; proven in ``tests/test_sedt.py``). The evaluation
(``jaxrl_mt.eval.sedt_eval``) still counts hurt cases, so the ``"coverage"`` ablation's show up.

Batching: for a batch of conversations, ONE embedding call (``Scorer.score``) for all turns and
anchors, ONE sampler call for the SeDT final turns and ONE for all corrections.

Integration: the earlier turns run in ``jaxrl_mt.conversations.run_conversations``'s lockstep
loop like any strategy's (same KV cache reuse, same seed stream as ``"plain"``); SeDT is its
``final_turn`` hook (:class:`FinalTurnHold`), which holds back each conversation's final planned
turn and answers all of them in one batch. Importing this module registers the ``"sedt"``
strategy in ``jaxrl_mt.strategies``, so ``--config.strategy=sedt`` in
``python -m jaxrl_mt.evaluate`` uses :func:`sedt_strategy` with the default :class:`SeDTConfig`
(``make_strategy`` builds one with another config). For a user's own conversation, see
:func:`respond`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.conversations import SEED_STRIDE, ConversationRun, TurnRecord, UserPolicy, run_conversations
from jaxrl_mt.rewards.verifier import find_numbers
from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.scoring import Scorer, cosine, embed_texts
from jaxrl_mt.strategies import register_strategy

__all__ = [
    "CONFIRMED",
    "GUARDS",
    "SEED_STRIDE",
    "UNCERTAIN",
    "Annotation",
    "FinalTurnHold",
    "GivenUser",
    "SeDTConfig",
    "SeDTResult",
    "annotate",
    "annotate_batch",
    "content_words",
    "correction_prompt",
    "coverage",
    "format_prompt",
    "guard_replace",
    "jaccard",
    "labels_from_relevance",
    "make_embedder",
    "make_strategy",
    "positional_weights",
    "relevance",
    "respond",
    "returns_to_go",
    "run_until_final",
    "sedt_final_turn",
    "sedt_strategy",
    "should_trigger",
    "summarize",
]

log = logging.getLogger(__name__)

CONFIRMED, UNCERTAIN = "CONFIRMED", "UNCERTAIN"
GUARDS = ("no_answer", "coverage")  # replacement rules of the self-correction guard (see guard_replace)
Embedder = Callable[[Sequence[str]], np.ndarray]  # texts -> [N, D] embeddings

DEFAULT_ANCHORS = (
    ("math", "Compute the final numeric answer to the word problem"),
    ("code", "Write a complete Python function"),
)
DEFAULT_ANSWER_FORMATS = (
    ("math", 'Solve it step by step and end with "The answer is <number>."'),
    ("code", "Reply with the complete function in one Python code block."),
)
PROMPT_HEADER = ("Here is everything I told you, one message per line as (return-to-go, label, message).\n"
                 "Return-to-go is how relevant that message and all later ones are to the task (higher "
                 "means more); CONFIRMED messages are key facts, UNCERTAIN ones may matter less.")

# A small English stop-word list (function words only); content words are everything else.
STOP_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just let me more
most my myself no nor not now of off on once only or other our ours ourselves out over own same
she should so some such than that the their theirs them themselves then there these they this
those through to too under until up very was we were what when where which while who whom why will
with would you your yours yourself yourselves s t don isn aren wasn weren didn doesn won also
""".split())
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_WORD = re.compile(r"[a-z0-9]+(?:[.'][a-z0-9]+)*")


@dataclasses.dataclass(frozen=True)
class SeDTConfig:
    """SeDT's constants (defaults from the method)."""

    w_sem: float = 0.6  # weight of the semantic signal in rel(t)
    w_lex: float = 0.2  # weight of the lexical (Jaccard) signal in rel(t)
    w_pos: float = 0.2  # weight of the positional (inverted-U) signal in rel(t)
    sem_map: str = "affine"  # cosine -> [0, 1]: "affine" (cos + 1) / 2 | "clip" max(cos, 0)
    last_shard_floor: float = 0.5  # last-shard guarantee: rel of the final turn is at least this
    trigger_last_rel: float = 0.8  # self-correct when rel[T-1] / max(rel) is below this
    trigger_uncertain_frac: float = 0.5  # ... or when the fraction of UNCERTAIN turns is above this
    self_correct: bool = True  # run the guarded self-correction at all
    keep_history: bool = False  # keep the chat history before the annotated final message
    min_turns: int = 2  # conversations with fewer user turns are answered plainly (nothing to rank)
    encoder: str = "scorer"  # "scorer" (the project's Scorer) | "st:PATH" (a local sentence-transformers model)
    sem_model: str = ""  # scorer encoder only: model spec to embed with ("": the policy being run)
    anchors: tuple[tuple[str, str], ...] = DEFAULT_ANCHORS  # (domain, goal anchor) pairs
    default_anchor: str = "Complete the task using all the information given"  # anchor of other domains
    answer_formats: tuple[tuple[str, str], ...] = DEFAULT_ANSWER_FORMATS  # (domain, answer instruction) pairs
    guard: str = "no_answer"  # replacement rule: "no_answer" (only a number-less original; zero hurt) | "coverage"

    def __post_init__(self):
        for f in ("w_sem", "w_lex", "w_pos", "last_shard_floor", "trigger_last_rel", "trigger_uncertain_frac"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"SeDTConfig field '{f}': expected a number, got {v!r}")
        if min(self.w_sem, self.w_lex, self.w_pos) < 0 or abs(self.w_sem + self.w_lex + self.w_pos - 1) > 1e-6:
            raise ValueError(f"SeDTConfig fields 'w_sem', 'w_lex', 'w_pos': must be >= 0 and sum to 1, got "
                             f"{self.w_sem}, {self.w_lex}, {self.w_pos}")
        if not 0 <= self.last_shard_floor <= 1:
            raise ValueError(f"SeDTConfig field 'last_shard_floor': expected a value in [0, 1], "
                             f"got {self.last_shard_floor}")
        if self.sem_map not in ("affine", "clip"):
            raise ValueError(f"SeDTConfig field 'sem_map': expected 'affine' or 'clip', got {self.sem_map!r}")
        if self.encoder != "scorer" and not self.encoder.startswith("st:"):
            raise ValueError(f"SeDTConfig field 'encoder': expected 'scorer' or 'st:PATH', got {self.encoder!r}")
        if self.min_turns < 1:
            raise ValueError(f"SeDTConfig field 'min_turns': expected >= 1, got {self.min_turns}")
        if self.guard not in GUARDS:
            raise ValueError(f"SeDTConfig field 'guard': expected one of {', '.join(map(repr, GUARDS))}, "
                             f"got {self.guard!r}")

    def anchor(self, domain: str) -> str:
        """The goal anchor of a task domain."""
        return dict(self.anchors).get(domain, self.default_anchor)

    def answer_format(self, domain: str) -> str:
        """The answer instruction of a task domain ("" if none)."""
        return dict(self.answer_formats).get(domain, "")


# --------------------------------------------------------------------------- pure math


def content_words(text: str) -> frozenset[str]:
    """Lower-cased words and numbers of a text minus stop words ("1,234" -> "1234")."""
    words = _WORD.findall(_THOUSANDS.sub("", text.lower()))
    return frozenset(w for w in words if w not in STOP_WORDS)


def jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    """|a & b| / |a | b| (0 when both are empty)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def positional_weights(n: int) -> np.ndarray:
    """The inverted U [n]: 1 - |t - c| / (c + 1) with c = (n - 1) / 2."""
    if n < 1:
        raise ValueError(f"positional_weights: need at least one turn, got {n}")
    t = np.arange(n, dtype=np.float64)  # [T]
    c = (n - 1) / 2
    return 1.0 - np.abs(t - c) / (c + 1.0)


def sem_from_cosine(cos: np.ndarray, sem_map: str = "affine") -> np.ndarray:
    """Maps cosines [T] in [-1, 1] to [0, 1]: (cos + 1) / 2, or max(cos, 0) for "clip"."""
    cos = np.clip(np.asarray(cos, np.float64), -1.0, 1.0)
    return (cos + 1.0) / 2.0 if sem_map == "affine" else np.maximum(cos, 0.0)


def relevance(sem: np.ndarray, lex: np.ndarray, pos: np.ndarray, cfg: SeDTConfig) -> np.ndarray:
    """rel [T] = w_sem sem + w_lex lex + w_pos pos, then the last-shard floor on rel[T-1]."""
    rel = cfg.w_sem * np.asarray(sem, np.float64) + cfg.w_lex * np.asarray(lex, np.float64) \
        + cfg.w_pos * np.asarray(pos, np.float64)  # [T]
    rel[-1] = max(rel[-1], cfg.last_shard_floor)
    return rel


def returns_to_go(rel: np.ndarray) -> np.ndarray:
    """R̂ [T]: R̂[t] = sum of rel[t:] (a reversed cumulative sum)."""
    return np.cumsum(np.asarray(rel, np.float64)[::-1])[::-1].copy()


def labels_from_relevance(rel: np.ndarray) -> tuple[str, ...]:
    """CONFIRMED where rel is strictly above its mean, else UNCERTAIN."""
    rel = np.asarray(rel, np.float64)
    mean = rel.mean()
    return tuple(CONFIRMED if r > mean else UNCERTAIN for r in rel)


@dataclasses.dataclass(frozen=True)
class Annotation:
    """SeDT's view of one conversation's user turns (all arrays are per turn, length T)."""

    shards: tuple[str, ...]  # the user turns, in order (the last is the final turn)
    anchor: str  # the goal anchor they were compared with
    sem: tuple[float, ...]  # semantic signal in [0, 1]
    lex: tuple[float, ...]  # Jaccard overlap with the anchor
    pos: tuple[float, ...]  # positional weight
    rel: tuple[float, ...]  # relevance (last-shard floor applied)
    rtg: tuple[float, ...]  # return-to-go
    labels: tuple[str, ...]  # CONFIRMED / UNCERTAIN

    @property
    def tuples(self) -> list[tuple[float, str, str]]:
        """[(R̂_t, label, shard_t)]."""
        return list(zip(self.rtg, self.labels, self.shards))

    @property
    def uncertain_fraction(self) -> float:
        return sum(lab == UNCERTAIN for lab in self.labels) / len(self.labels)

    @property
    def last_relevance(self) -> float:
        """rel[T-1] / max(rel): the final shard's normalised relevance."""
        top = max(self.rel)
        return self.rel[-1] / top if top > 0 else 0.0

    @property
    def confirmed_words(self) -> frozenset[str]:
        """Content words of the CONFIRMED turns."""
        out: set[str] = set()
        for s, lab in zip(self.shards, self.labels):
            if lab == CONFIRMED:
                out |= content_words(s)
        return frozenset(out)

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def annotate(shards: Sequence[str], sem: Sequence[float], anchor: str, cfg: SeDTConfig) -> Annotation:
    """The annotation of one conversation given its semantic signal [T] (lex and pos computed here)."""
    if not shards:
        raise ValueError("annotate: no user turns")
    if len(sem) != len(shards):
        raise ValueError(f"annotate: {len(shards)} turns but {len(sem)} semantic values")
    aw = content_words(anchor)
    lex = np.array([jaccard(content_words(s), aw) for s in shards])  # [T]
    pos = positional_weights(len(shards))  # [T]
    rel = relevance(np.asarray(sem, np.float64), lex, pos, cfg)  # [T]
    f = lambda a: tuple(float(x) for x in a)  # noqa: E731
    return Annotation(tuple(shards), anchor, f(sem), f(lex), f(pos), f(rel), f(returns_to_go(rel)),
                      labels_from_relevance(rel))


def should_trigger(ann: Annotation, cfg: SeDTConfig) -> bool:
    """Whether the conversation is weak enough to self-correct (and there is something to cover)."""
    if not cfg.self_correct or not ann.confirmed_words:
        return False
    return ann.last_relevance < cfg.trigger_last_rel or ann.uncertain_fraction > cfg.trigger_uncertain_frac


def coverage(text: str, words: frozenset[str]) -> float:
    """Fraction of `words` among the content words of `text` (0 when `words` is empty)."""
    return len(content_words(text) & words) / len(words) if words else 0.0


def guard_replace(original: str, candidate: str, words: frozenset[str], *, guard: str = "no_answer") -> bool:
    """Whether the self-correction `candidate` replaces the `original` answer.

    The coverage rule (the method's): the candidate covers strictly more of `words` (the
    CONFIRMED content words) than the original. ``guard="coverage"`` applies only that rule (an
    ablation; it can replace a right answer with a wrong one). ``guard="no_answer"`` (default)
    also needs the original to hold no number at all (``find_numbers(original) == []``, the
    verifier's own number reader) and the candidate to hold one.

    Why ``"no_answer"`` cannot hurt: a response without a number has no extracted answer (strict)
    and no trailing numbers (lenient), so it scores 0 under both verifier modes for every gold
    answer; the replacement scores >= 0. Under the LiC protocol (stop at the first correct
    attempt, score the last attempt) every earlier attempt of a conversation that reaches its
    final turn was wrong, so the score with the number-less final turn is 0 whatever its judge
    label, and the replaced one cannot score less; under ``final_turn`` only the last turn counts.

    Args:
      original: the SeDT answer.
      candidate: the correction.
      words: CONFIRMED content words (nothing is replaced when empty).
      guard: ``"no_answer"`` or ``"coverage"``.

    Raises:
      ValueError: an unknown ``guard``.
    """
    if guard not in GUARDS:
        raise ValueError(f"guard_replace: unknown guard {guard!r}; expected one of {', '.join(map(repr, GUARDS))}")
    covers = bool(words) and coverage(candidate, words) > coverage(original, words)
    if guard == "coverage":
        return covers
    return covers and not find_numbers(original) and bool(find_numbers(candidate))


def format_prompt(ann: Annotation, answer_format: str = "") -> str:
    """The final user message: annotated tuples, then the task (see the module docstring)."""
    lines = [PROMPT_HEADER]
    lines += [f"({r:.2f}, {lab}, {json.dumps(s, ensure_ascii=False)})" for r, lab, s in ann.tuples]
    task = f"Task: {ann.anchor.rstrip('.')}. Use every CONFIRMED message."
    lines.append(f"{task} {answer_format}".rstrip())
    return "\n".join(lines)


def correction_prompt(ann: Annotation, answer: str, answer_format: str = "") -> str:
    """The verifier call's message: confirmed facts, the proposed answer, and a request to fix it."""
    conf = [s for s, lab in zip(ann.shards, ann.labels) if lab == CONFIRMED]
    unc = [s for s, lab in zip(ann.shards, ann.labels) if lab != CONFIRMED]
    parts = ["Check a proposed answer.", "Key facts (CONFIRMED):", *[f"- {s}" for s in conf]]
    if unc:
        parts += ["Other messages (UNCERTAIN):", *[f"- {s}" for s in unc]]
    parts += [f"Task: {ann.anchor.rstrip('.')}.", "Proposed answer:", answer.strip() or "(empty)",
              f"Check it against every key fact and write a corrected, complete answer that uses all the key "
              f"facts. {answer_format}".rstrip()]
    return "\n".join(parts)


# --------------------------------------------------------------------------- embeddings


def scorer_embedder(scorer: Scorer, tokenizer: Any) -> Embedder:
    """Embeds texts with the project's scorer (pooled hidden states, ``embed_texts``)."""
    return lambda texts: embed_texts(scorer, tokenizer, texts)


_LOADED: dict[str, Embedder] = {}


def make_embedder(cfg: SeDTConfig, sampler: Sampler | None = None) -> Embedder:
    """The semantic encoder of a config.

    ``encoder="scorer"``: a Scorer over the policy's parameters (the sampler's), or over
    ``sem_model`` when set. ``encoder="st:PATH"``: a sentence-transformers model from a local
    folder (needs the ``sentence-transformers`` package; the method used all-mpnet-base-v2).
    """
    if cfg.encoder.startswith("st:"):
        path = cfg.encoder[3:]
        if path not in _LOADED:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise ValueError(f"SeDTConfig field 'encoder': {cfg.encoder!r} needs the sentence-transformers "
                                 "package (pip install sentence-transformers)") from None
            model = SentenceTransformer(path, local_files_only=True)
            _LOADED[path] = lambda texts: np.asarray(model.encode(list(texts)), np.float64)
        return _LOADED[path]
    if cfg.sem_model:
        if cfg.sem_model not in _LOADED:
            from jaxrl_mt.models.registry import load_model

            m = load_model(cfg.sem_model)
            _LOADED[cfg.sem_model] = scorer_embedder(Scorer(m.params, m.cfg, pad_id=m.pad_id, batch_size=32),
                                                     m.tokenizer)
        return _LOADED[cfg.sem_model]
    if sampler is None:
        raise ValueError("make_embedder: the scorer encoder of the policy needs its sampler")
    return scorer_embedder(Scorer(sampler.params, sampler.cfg, pad_id=sampler.pad_id, batch_size=32),
                           sampler.tokenizer)


def annotate_batch(embed: Embedder, shard_lists: Sequence[Sequence[str]], domains: Sequence[str],
                   cfg: SeDTConfig) -> list[Annotation]:
    """Annotations of many conversations with ONE embedding call over all distinct turns and anchors."""
    if len(shard_lists) != len(domains):
        raise ValueError(f"annotate_batch: {len(shard_lists)} conversations but {len(domains)} domains")
    anchors = [cfg.anchor(d) for d in domains]
    texts = list(dict.fromkeys([s for sl in shard_lists for s in sl] + anchors))
    if not texts:
        return []
    emb = np.asarray(embed(texts))  # [U, D]
    row = {t: i for i, t in enumerate(texts)}
    out = []
    for shards, anchor in zip(shard_lists, anchors):
        e = emb[[row[s] for s in shards]]  # [T, D]
        sem = sem_from_cosine(cosine(e, emb[row[anchor]]), cfg.sem_map)  # [T]
        out.append(annotate(shards, sem, anchor, cfg))
    return out


# --------------------------------------------------------------------------- batched final turn


def _prompt_ids(sampler: Sampler, run: ConversationRun, message: str, keep_history: bool, budget: int) -> list[int]:
    """The final prompt's ids; the history is dropped when it would not fit the context."""
    msgs = (run.messages if keep_history else []) + [{"role": "user", "content": message}]
    ids = encode_prompt(sampler.tokenizer, msgs, system=run.system)
    if keep_history and len(ids) + budget > sampler.cfg.max_position_embeddings:
        return _prompt_ids(sampler, run, message, False, budget)
    return ids


def sedt_final_turn(sampler: Sampler, runs: Sequence[ConversationRun], final_users: Sequence[str],
                    sampling: SamplingConfig, *, cfg: SeDTConfig | None = None, embed: Embedder | None = None,
                    seed: int = 0) -> list[dict[str, Any]]:
    """Answers the final user turn of each run with SeDT and appends it as a TurnRecord.

    One embedding call for all turns, one sampler call for the SeDT answers, one for the
    corrections of the triggered runs.

    Args:
      sampler: the policy's sampler (with a tokenizer).
      runs: conversations whose earlier turns are done (``run.turns``).
      final_users: each run's final user message.
      sampling: sampling settings of both calls.
      cfg: the SeDT config; embed: the semantic encoder (default ``make_embedder(cfg, sampler)``).
      seed: sampler seed (the corrections use seed + 1).

    Returns:
      Per run, the record stored in ``turn.info["sedt"]``: ``prompt``, ``annotation``,
      ``triggered``, ``original`` (the SeDT answer before correction), ``correction`` (or None),
      ``coverage_original``, ``coverage_correction``, ``guard`` (the guard mode), ``replaced``.
      The appended TurnRecord keeps the user's own final message as ``user``; its ``assistant``
      is the chosen answer.
    """
    return _final_turn(sampler, runs, final_users, sampling, cfg or SeDTConfig(), embed, seed)[1]


def _final_turn(sampler: Sampler, runs: Sequence[ConversationRun], final_users: Sequence[str],
                sampling: SamplingConfig, cfg: SeDTConfig, embed: Embedder | None, seed: int
                ) -> tuple[list[Annotation], list[dict[str, Any]]]:
    if len(runs) != len(final_users):
        raise ValueError(f"sedt_final_turn: {len(runs)} runs but {len(final_users)} final messages")
    if not runs:
        return [], []
    embed = embed or make_embedder(cfg, sampler)
    domains = [r.meta.get("domain", "math") for r in runs]
    anns = annotate_batch(embed, [[t.user for t in r.turns] + [u] for r, u in zip(runs, final_users)], domains, cfg)
    msgs = [format_prompt(a, cfg.answer_format(d)) for a, d in zip(anns, domains)]
    prompts = [_prompt_ids(sampler, r, m, cfg.keep_history, sampling.max_new_tokens) for r, m in zip(runs, msgs)]
    res = sampler.generate_ids(prompts, sampling, seed=seed)
    trig = [i for i, a in enumerate(anns) if should_trigger(a, cfg)]
    corr: dict[int, tuple[str, list[int], np.ndarray, str]] = {}
    if trig:
        cps = [encode_prompt(sampler.tokenizer, [{"role": "user", "content": correction_prompt(
            anns[i], res.texts[i], cfg.answer_format(domains[i]))}], system=runs[i].system) for i in trig]
        cres = sampler.generate_ids(cps, sampling, seed=seed + 1)
        for j, i in enumerate(trig):
            corr[i] = (cres.texts[j], list(cres.tokens[j]), cres.logprobs[j], cres.finish_reasons[j])
    infos = []
    for i, (r, u, a) in enumerate(zip(runs, final_users, anns)):
        text, toks, lps, fin = res.texts[i], list(res.tokens[i]), res.logprobs[i], res.finish_reasons[i]
        words = a.confirmed_words
        info = {"prompt": msgs[i], "annotation": a.to_json(), "triggered": i in corr, "original": text,
                "correction": None, "coverage_original": coverage(text, words), "coverage_correction": None,
                "guard": cfg.guard, "replaced": False}
        if i in corr:
            ctext = corr[i][0]
            info.update(correction=ctext, coverage_correction=coverage(ctext, words),
                        replaced=guard_replace(text, ctext, words, guard=cfg.guard))
            if info["replaced"]:
                text, toks, lps, fin = corr[i]
        r.turns.append(TurnRecord(index=len(r.turns), user=u, assistant=text, tokens=toks,
                                  logprobs=[float(x) for x in lps], finish_reason=fin,
                                  prompt_tokens=len(prompts[i]), info={"sedt": info}))
        infos.append(info)
    s = summarize(infos)
    log.info("SeDT final turn: %d conversations, trigger rate %.3f, %d replaced", s["n"], s["trigger_rate"],
             s["replaced"])
    return anns, infos


def summarize(infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Trigger and replacement counts of SeDT final turns (``turn.info["sedt"]`` records)."""
    n = len(infos)
    trig = sum(bool(i["triggered"]) for i in infos)
    rep = sum(bool(i["replaced"]) for i in infos)
    return {"n": n, "triggered": trig, "trigger_rate": trig / n if n else 0.0, "replaced": rep,
            "replacement_rate": rep / n if n else 0.0, "replaced_of_triggered": rep / trig if trig else 0.0}


# --------------------------------------------------------------------------- the evaluator strategy


class GivenUser:
    """A user policy that returns already fetched messages, once each (by run identity)."""

    def __init__(self, runs: Sequence[ConversationRun], texts: Sequence[str]):
        self.text = {id(r): t for r, t in zip(runs, texts)}

    def next_user_turns(self, runs: Sequence[ConversationRun]) -> list[str | None]:
        return [self.text.pop(id(r), None) for r in runs]


def _is_final(run: ConversationRun, cfg: SeDTConfig) -> bool:
    planned = int(run.meta.get("n_planned", len(run.user_turns)))
    return planned >= cfg.min_turns and len(run.turns) + 1 >= planned


class FinalTurnHold:
    """The ``final_turn`` hook of ``run_conversations``: holds back each conversation's final turn.

    A run whose next message is its final planned turn (``meta["n_planned"]``, else its number
    of planned user turns), and that has at least ``cfg.min_turns`` planned, is held. The held
    runs, their messages and the seed of their turn are kept (``runs``, ``messages``, ``seed``)
    and handed to ``answer_fn`` when one is given (SeDT's final turn); without it they stay
    unanswered for the caller.
    """

    def __init__(self, cfg: SeDTConfig, answer_fn: Callable[[Sequence[ConversationRun], Sequence[str], int], Any]
                 | None = None):
        self.cfg, self.answer_fn = cfg, answer_fn
        self.runs: list[ConversationRun] = []
        self.messages: list[str] = []
        self.seed: int | None = None

    def holds(self, run: ConversationRun) -> bool:
        return _is_final(run, self.cfg)

    def answer(self, runs: Sequence[ConversationRun], messages: Sequence[str], seed: int) -> None:
        self.runs, self.messages, self.seed = list(runs), list(messages), seed
        if self.answer_fn is not None:
            self.answer_fn(runs, messages, seed)


def run_until_final(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *,
                    cfg: SeDTConfig | None = None, seed: int = 0, user: UserPolicy | None = None,
                    on_turn: Callable[[Sequence[ConversationRun]], None] | None = None,
                    progress: Callable[[int, int], None] | None = None, reuse_cache: bool = False
                    ) -> tuple[list[ConversationRun], list[str], int]:
    """Advances the runs with ``run_conversations`` up to their final turn, which is held back.

    Returns:
      ``(held runs, their final user messages, the seed of their final turn)``; runs that ended
      earlier are not held.
    """
    hold = FinalTurnHold(cfg or SeDTConfig())
    run_conversations(sampler, runs, sampling, seed=seed, user=user, on_turn=on_turn, progress=progress,
                      reuse_cache=reuse_cache, final_turn=hold)
    return hold.runs, hold.messages, seed if hold.seed is None else hold.seed


def sedt_strategy(sampler: Sampler, runs: Sequence[ConversationRun], sampling: SamplingConfig, *, seed: int = 0,
                  user: UserPolicy | None = None, on_turn: Callable[[Sequence[ConversationRun]], None] | None = None,
                  progress: Callable[[int, int], None] | None = None, reuse_cache: bool = False,
                  config: SeDTConfig | None = None, embed: Embedder | None = None) -> list[ConversationRun]:
    """The ``"sedt"`` strategy of the LiC simulator (same signature as ``run_conversations``).

    Earlier turns are answered by ``run_conversations`` (lockstep, KV cache kept with
    ``reuse_cache``, the plain seed stream); every conversation's final turn is held
    (:class:`FinalTurnHold`) and answered by :func:`sedt_final_turn` in one batch, after which
    ``on_turn`` sees them. Conversations that end before their final turn (e.g. the ``lic``
    protocol's stop at a correct answer) are never rewritten. Suits SHARDED, MT-Refine, AtR and
    AiwR (and any multi-turn kind); single-turn kinds (FULL, CONCAT) are answered plainly.
    """
    cfg = config or SeDTConfig()

    def answer(held: Sequence[ConversationRun], finals: Sequence[str], final_seed: int) -> None:
        sedt_final_turn(sampler, held, finals, sampling, cfg=cfg, embed=embed, seed=final_seed)

    return run_conversations(sampler, runs, sampling, seed=seed, user=user, on_turn=on_turn, progress=progress,
                             reuse_cache=reuse_cache, final_turn=FinalTurnHold(cfg, answer))


def make_strategy(config: SeDTConfig, embed: Embedder | None = None) -> Callable[..., list[ConversationRun]]:
    """A strategy function with a given SeDT config (for ``register_strategy``)."""
    def strategy(sampler, runs, sampling, **kw):
        return sedt_strategy(sampler, runs, sampling, config=config, embed=embed, **kw)
    return strategy


# --------------------------------------------------------------------------- user API


@dataclasses.dataclass(frozen=True)
class SeDTResult:
    """SeDT's answer to one conversation."""

    text: str  # the chosen answer
    original: str  # the SeDT answer before self-correction
    correction: str | None  # the verifier call's answer (None: not triggered)
    replaced: bool  # the correction replaced the original
    annotation: Annotation  # the (R̂, label, shard) view of the user turns
    prompt: str  # the annotated final message the model got


def respond(sampler: Sampler, conversations: Sequence[Sequence[Mapping[str, str]]], *, domain: str = "math",
            sampling: SamplingConfig | None = None, config: SeDTConfig | None = None, seed: int = 0,
            system: str | None = None, embed: Embedder | None = None) -> list[SeDTResult]:
    """Answers the last user message of each conversation with SeDT (batched).

    Args:
      sampler: the model's sampler (with a tokenizer).
      conversations: chat messages ``{"role": "user"|"assistant", "content": str}``, users and
        assistants alternating, starting and ending with a user message.
      domain: picks the goal anchor (``"math"``, ``"code"``, else the default anchor).
      sampling, config, seed, system, embed: as in :func:`sedt_final_turn`.

    Raises:
      ValueError: ``conversation i, message j: ...`` for a malformed conversation.
    """
    runs, finals = [], []
    for i, conv in enumerate(conversations):
        if not conv:
            raise ValueError(f"conversation {i}: empty")
        for j, m in enumerate(conv):
            want = "user" if j % 2 == 0 else "assistant"
            if not isinstance(m, Mapping) or m.get("role") != want or not isinstance(m.get("content"), str):
                raise ValueError(f"conversation {i}, message {j}: expected a {want!r} message with string content, "
                                 f"got {m!r}")
        if len(conv) % 2 == 0:
            raise ValueError(f"conversation {i}, message {len(conv) - 1}: the last message must be the user's")
        turns = [TurnRecord(index=k, user=conv[2 * k]["content"], assistant=conv[2 * k + 1]["content"], tokens=[],
                            logprobs=[], finish_reason="stop", prompt_tokens=0) for k in range(len(conv) // 2)]
        runs.append(ConversationRun(conv_id=str(i), system=system, user_turns=[conv[2 * k]["content"]
                                    for k in range(len(conv) // 2 + 1)], meta={"domain": domain}, turns=turns))
        finals.append(conv[-1]["content"])
    anns, infos = _final_turn(sampler, runs, finals, sampling or SamplingConfig(), config or SeDTConfig(), embed, seed)
    return [SeDTResult(text=r.turns[-1].assistant, original=f["original"], correction=f["correction"],
                       replaced=f["replaced"], annotation=a, prompt=f["prompt"])
            for r, a, f in zip(runs, anns, infos)]


register_strategy("sedt", sedt_strategy)

"""SeDT's annotation: config, the pure relevance math, prompts, the guard, and batched embeddings.

See the package doc (``jaxrl_mt.sedt``) for the formulas. Everything here is a pure function of
texts and numbers except :func:`make_embedder` / :func:`annotate_batch`, which embed texts with
the project's scorer (one ``Scorer.score`` call for a whole batch).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Sequence

import numpy as np

from jaxrl_mt.rewards.verifier import find_numbers
from jaxrl_mt.sampling import Sampler
from jaxrl_mt.scoring import Scorer, cosine, embed_texts

CONFIRMED, UNCERTAIN = "CONFIRMED", "UNCERTAIN"
GUARDS = ("no_answer", "coverage")  # replacement rules of the self-correction guard (see guard_replace)
# the ablation arms of ``jaxrl_mt.eval.sedt_eval`` (see ``jaxrl_mt.sedt.ablations``)
ABLATIONS = ("semantic_only", "lexical_only", "positional_only", "uniform", "random_rtg")
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


def _ablation_names(value: Any) -> tuple[str, ...]:
    """``SeDTConfig.ablations`` as a tuple in ``ABLATIONS`` order ("all", "a,b" and lists accepted).

    Raises:
      ValueError: an unknown name.
    """
    if isinstance(value, str):
        value = ABLATIONS if value.strip() == "all" else [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"SeDTConfig field 'ablations': expected names, 'all' or a list, got {value!r}")
    names = list(value)
    bad = [n for n in names if n not in ABLATIONS]
    if bad:
        raise ValueError(f"SeDTConfig field 'ablations': unknown {bad[0]!r}; expected 'all' or names of "
                         f"{', '.join(map(repr, ABLATIONS))}")
    return tuple(n for n in ABLATIONS if n in names)


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
    # sedt_eval only: ablation arms answered next to SeDT on the same histories (names of ABLATIONS, "all" or a
    # comma-separated string are read too); the strategy and `respond` ignore it
    ablations: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "ablations", _ablation_names(self.ablations))
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

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Annotation":
        """The inverse of :meth:`to_json`."""
        return cls(**{f.name: d[f.name] if f.name == "anchor" else tuple(d[f.name]) for f in dataclasses.fields(cls)})


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


RESTATE_HEADER = "Here is everything I told you, one message per line."


def restate_prompt(shards: Sequence[str], anchor: str, answer_format: str = "") -> str:
    """The control arm's final message: :func:`format_prompt` without the relevance annotation.

    Every shard is restated in order as a JSON string, after a header that mentions no
    return-to-go or label, and the task line drops "Use every CONFIRMED message."; the anchor
    and the answer instruction are the same as SeDT's, so SeDT and this control differ only in
    the annotation.
    """
    lines = [RESTATE_HEADER, *[json.dumps(s, ensure_ascii=False) for s in shards]]
    lines.append(f"Task: {anchor.rstrip('.')}. {answer_format}".rstrip())
    return "\n".join(lines)


def with_answer_format(message: str, answer_format: str = "") -> str:
    """A plain final user message with the answer instruction on its own line ("" leaves it as is)."""
    return f"{message.rstrip()}\n{answer_format}" if answer_format else message


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
    return scorer_embedder(Scorer(sampler.params, sampler.cfg, pad_id=sampler.pad_id, batch_size=32,
                                  mesh=getattr(sampler, "mesh", None)), sampler.tokenizer)


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

"""Teacher-forced scoring: per-token log-probabilities and pooled hidden states.

One jitted function serves the RLSTA anchor reward (geometric-mean likelihood of an answer under
a prompt), the GRPO loss (per-token log-probs under `jax.grad`) and SeDT's semantic signal (cosine
of pooled hidden states). The vocabulary projection is computed in chunks over the time axis
and rematerialised, so [B, T, V] logits never exist at once.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.batching import bucket, pack_rows
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params, forward, lm_head, positions_from_mask
from jaxrl_mt.models.grouped import forward_grouped


def token_logprobs(params: Params, cfg: ModelConfig, tokens: jax.Array, token_mask: jax.Array, *,
                   temperature: float | jax.Array = 1.0, chunk: int = 128, remat: bool | str = False,
                   with_entropy: bool = False) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """Log-probability of every token given the ones before it.

    Args:
      params, cfg: the model.
      tokens: [B, T] ids (left or right padded).
      token_mask: [B, T] bool, True on real tokens.
      temperature: logits are divided by it before the softmax (as the sampler does).
      chunk: time-chunk of the vocabulary projection.
      remat: rematerialise decoder layers (for gradients of long sequences).
      with_entropy: also return the per-token entropy of the predictive distribution.

    Returns:
      logp [B, T] (logp[:, t] = log p(tokens[:, t] | tokens[:, :t]); 0 at t = 0 and on pads),
      hidden [B, T, D] final hidden states, entropy [B, T] or None.
    """
    b, t = tokens.shape
    positions = positions_from_mask(token_mask)
    _, hidden, _ = forward(params, cfg, tokens, positions, token_mask, logits="none", remat=remat)
    lp, ent = head_logprobs(params, cfg, hidden[:, :-1], tokens[:, 1:], temperature=temperature, chunk=chunk,
                            with_entropy=with_entropy)  # hidden[:, :-1] predicts tokens[:, 1:]
    valid = token_mask[:, 1:] & token_mask[:, :-1]
    lp = jnp.concatenate([jnp.zeros((b, 1)), jnp.where(valid, lp, 0.0)], axis=1)
    ent = jnp.concatenate([jnp.zeros((b, 1)), jnp.where(valid, ent, 0.0)], axis=1)
    return lp, hidden, (ent if with_entropy else None)


def head_logprobs(params: Params, cfg: ModelConfig, h: jax.Array, tgt: jax.Array, *,
                  temperature: float | jax.Array = 1.0, chunk: int = 128, with_entropy: bool = False
                  ) -> tuple[jax.Array, jax.Array]:
    """Log-probs [B, n] of targets [B, n] under the head at hidden states h [B, n, D], and entropies.

    The vocabulary projection runs over time chunks of `chunk`, each rematerialised, so [B, n, V]
    logits never exist at once. The entropy is zeros unless `with_entropy`.
    """
    b, n = tgt.shape
    c = max(1, min(chunk, n))
    pad = (-n) % c
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    tgt = jnp.pad(tgt, ((0, 0), (0, pad)))
    hc = h.reshape(b, -1, c, h.shape[-1]).swapaxes(0, 1)  # [C, B, c, D]
    tc = tgt.reshape(b, -1, c).swapaxes(0, 1)  # [C, B, c]

    @jax.checkpoint
    def one(args):
        hx, tx = args
        logits = lm_head(params, cfg, hx) / temperature  # [B, c, V] fp32
        lse = jax.nn.logsumexp(logits, axis=-1)
        lp = jnp.take_along_axis(logits, tx[..., None], axis=-1)[..., 0] - lse  # [B, c]
        if with_entropy:
            p = jax.nn.softmax(logits, axis=-1)
            ent = lse - jnp.sum(p * logits, axis=-1)
        else:
            ent = jnp.zeros_like(lp)
        return lp, ent

    lp, ent = jax.lax.map(one, (hc, tc))  # [C, B, c]
    return lp.swapaxes(0, 1).reshape(b, -1)[:, :n], ent.swapaxes(0, 1).reshape(b, -1)[:, :n]


def grouped_logprobs(params: Params, cfg: ModelConfig, prefix: jax.Array, prefix_mask: jax.Array,
                     suffix: jax.Array, suffix_mask: jax.Array, *, temperature: float | jax.Array = 1.0,
                     chunk: int = 128, remat: bool | str = False, with_entropy: bool = False
                     ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """Log-probs of continuations that share prefixes (`models.grouped.forward_grouped`).

    Args:
      prefix: [Bp, P] left-padded ids; suffix: [Bp * G, C] right-padded ids, G rows per prefix.
      prefix_mask, suffix_mask: their real tokens.

    Returns:
      logp [Bp * G, C] of every suffix token given its prefix and the suffix before it (0 on pads
      and where the prefix is empty), the suffix's hidden states [Bp * G, C, D], entropy or None.
      Equal to `token_logprobs` of the rows [prefix | suffix] at the suffix positions.
    """
    hp, hs = forward_grouped(params, cfg, prefix, prefix_mask, suffix, suffix_mask, remat=remat)
    g = suffix.shape[0] // prefix.shape[0]
    h = jnp.concatenate([jnp.repeat(hp[:, None], g, axis=0), hs[:, :-1]], axis=1)  # [B, C, D]
    lp, ent = head_logprobs(params, cfg, h, suffix, temperature=temperature, chunk=chunk, with_entropy=with_entropy)
    prev = jnp.concatenate([jnp.repeat(prefix_mask[:, -1:], g, axis=0), suffix_mask[:, :-1]], axis=1)
    valid = suffix_mask & prev
    return jnp.where(valid, lp, 0.0), hs, (jnp.where(valid, ent, 0.0) if with_entropy else None)


def masked_mean(x: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
    """Mean of x where mask is True, over `axis` (None: all elements); 0 where the mask is empty.

    The denominator is clamped at 1 (as TRL): the one masked mean of the scorer, the GRPO loss
    and its logged metrics.
    """
    m = mask.astype(x.dtype)
    return jnp.sum(x * m, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


@functools.partial(jax.jit, static_argnames=("cfg", "chunk"))
def score_batch(params: Params, cfg: ModelConfig, tokens: jax.Array, token_mask: jax.Array,
                target_mask: jax.Array, pool_mask: jax.Array, chunk: int = 128) -> dict[str, jax.Array]:
    """Scores target spans and pools hidden states in one pass.

    Args:
      tokens: [B, T] ids; token_mask: [B, T] real tokens.
      target_mask: [B, T] tokens whose log-probabilities are scored (the completion).
      pool_mask: [B, T] tokens whose final hidden states are mean-pooled.

    Returns:
      logprobs [B, T] (0 off target), sum [B], count [B], mean [B], geo_mean [B] = exp(mean),
      pooled [B, D].
    """
    lp, hidden, _ = token_logprobs(params, cfg, tokens, token_mask, chunk=chunk)
    lp = jnp.where(target_mask, lp, 0.0)
    count = jnp.sum(target_mask, axis=-1)
    s = jnp.sum(lp, axis=-1)
    mean = s / jnp.maximum(count, 1)
    pooled = jnp.einsum("btd,bt->bd", hidden.astype(jnp.float32), pool_mask.astype(jnp.float32))
    pooled = pooled / jnp.maximum(jnp.sum(pool_mask, axis=-1, keepdims=True), 1)
    return {"logprobs": lp, "sum": s, "count": count, "mean": mean, "geo_mean": jnp.exp(mean),
            "pooled": pooled}


@functools.partial(jax.jit, static_argnames=("cfg", "chunk"))
def score_grouped(params: Params, cfg: ModelConfig, prefix: jax.Array, prefix_mask: jax.Array, suffix: jax.Array,
                  suffix_mask: jax.Array, chunk: int = 128) -> dict[str, jax.Array]:
    """`score_batch` of completions sharing contexts (`grouped_logprobs`), pooled over the completion.

    Returns:
      logprobs [B, C] (of the suffix tokens), sum, count, mean, geo_mean [B], pooled [B, D].
    """
    lp, hs, _ = grouped_logprobs(params, cfg, prefix, prefix_mask, suffix, suffix_mask, chunk=chunk)
    count = jnp.sum(suffix_mask, axis=-1)
    s = jnp.sum(lp, axis=-1)
    mean = s / jnp.maximum(count, 1)
    w = suffix_mask.astype(jnp.float32)
    pooled = jnp.einsum("btd,bt->bd", hs.astype(jnp.float32), w) / jnp.maximum(jnp.sum(w, -1, keepdims=True), 1)
    return {"logprobs": lp, "sum": s, "count": count, "mean": mean, "geo_mean": jnp.exp(mean), "pooled": pooled}


def context_groups(contexts: Sequence[Sequence[int]]) -> int:
    """G when the contexts come in runs of exactly G > 1 identical non-empty ones (consecutive rows), else 1."""
    runs: list[int] = []
    for i, c in enumerate(contexts):
        if len(c) == 0:
            return 1
        if i and list(c) == list(contexts[i - 1]):
            runs[-1] += 1
        else:
            runs.append(1)
    return runs[0] if runs and runs[0] > 1 and all(r == runs[0] for r in runs) else 1


@dataclasses.dataclass
class ScoreResult:
    """Host-side scores of a list of (context, completion) pairs."""

    logprobs: list[np.ndarray]  # per pair: [len(completion)] log-probs of the completion tokens
    sum: np.ndarray  # [N]
    mean: np.ndarray  # [N]
    geo_mean: np.ndarray  # [N] exp(mean log-prob): the geometric-mean likelihood
    pooled: np.ndarray  # [N, D] mean final hidden state over the pooled span


class Scorer:
    """Scores completions under contexts in bucketed, chunked batches of one jitted function.

    With a `mesh`, each batch's rows are split over its (data, fsdp) axes (padded to a multiple
    of their product, `parallel.row_shards`) like the sampler's and the train step's. With a
    mesh over several processes (multi-host), `score` is collective: every process calls it with
    its own rows (any number, 0 included), the processes agree on the number of batches and on
    their shapes, and each gets back the scores of its own rows.
    """

    def __init__(self, params: Params, cfg: ModelConfig, *, pad_id: int = 0, batch_size: int = 8,
                 chunk: int = 128, mesh: Any = None):
        self.params, self.cfg, self.pad_id = params, cfg, pad_id
        self.batch_size, self.chunk = batch_size, chunk
        self.mesh = mesh  # the params' mesh: rows are split over its (data, fsdp) axes

    def _shape(self, lens: Sequence[int], n: int, multi: bool) -> tuple[int, int]:
        """(rows, tokens) of one batch of pairs of total lengths `lens` (n pairs in the whole call)."""
        max_ctx = self.cfg.max_position_embeddings
        lens = list(lens) or [1]
        if max(lens) > max_ctx:
            raise ValueError(f"a context+completion of {max(lens)} tokens exceeds the model context {max_ctx}")
        t = min(bucket(max(lens), 16), max_ctx)
        bsz = self.batch_size if n > self.batch_size else bucket(len(lens), 1)
        if multi:
            from jaxrl_mt.parallel import agree_max_many

            t, bsz = agree_max_many([t, bsz])
        elif self.mesh is not None:
            from jaxrl_mt.parallel import row_shards

            m = row_shards(self.mesh)
            bsz = -(-bsz // m) * m
        return bsz, t

    def _batch(self, ctx: list[list[int]], comp: list[list[int]], pool: str, n: int, multi: bool
               ) -> list[np.ndarray]:
        """[tokens, token mask, target mask, pool mask] of one batch, each [rows, T] (rows padded)."""
        bsz, t = self._shape([len(a) + len(b) for a, b in zip(ctx, comp)], n, multi)
        seqs = [a + b for a, b in zip(ctx, comp)]
        tokens, tmask = pack_rows(seqs, self.pad_id, t, align="right", n_rows=bsz)
        target = np.zeros((bsz, t), bool)
        pmask = np.zeros((bsz, t), bool)
        for i, (a, s) in enumerate(zip(ctx, seqs)):
            target[i, len(a): len(s)] = True
            lo, hi = {"completion": (len(a), len(s)), "context": (0, len(a)), "all": (0, len(s))}[pool]
            pmask[i, lo:hi] = True
        return [tokens, tmask, target, pmask]

    def _place(self, arrays: list[np.ndarray]) -> list[Any]:
        """Rows onto the mesh (`parallel.put_rows`: this process's rows of a global batch); as is without one."""
        if self.mesh is None:
            return arrays
        from jaxrl_mt.parallel import put_rows

        return put_rows(self.mesh, arrays)

    def _run(self, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        """One `score_batch` call: this process's rows of its outputs, on the host (`parallel.fetch_rows`)."""
        from jaxrl_mt.parallel import fetch_rows

        return fetch_rows(score_batch(self.params, self.cfg, *self._place(arrays), chunk=self.chunk))

    def score(self, contexts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *,
              pool: str = "completion") -> ScoreResult:
        """Scores each completion given its context.

        Args:
          contexts: token ids of each context (e.g. a rendered prompt).
          completions: token ids of each completion (the scored span).
          pool: which span's hidden states to mean-pool: "completion", "context" or "all".
        """
        from jaxrl_mt.parallel import agree_max, spans_processes

        if len(contexts) != len(completions):
            raise ValueError(f"{len(contexts)} contexts but {len(completions)} completions")
        if pool not in ("completion", "context", "all"):
            raise ValueError(f"unknown pool {pool!r}")
        multi = spans_processes(self.mesh)
        n = len(contexts)
        g = context_groups(contexts) if not multi and pool == "completion" else 1
        if g > 1 and (n <= self.batch_size or self.batch_size % g == 0):
            return self._score_grouped(contexts, completions, g)
        n_batches = -(-n // self.batch_size)
        if multi:  # every process runs the same number of batches (some may be all padding)
            n_batches = agree_max(n_batches)
        out_lp: list[np.ndarray] = []
        parts: dict[str, list[np.ndarray]] = {"sum": [], "mean": [], "geo_mean": [], "pooled": []}
        for j in range(n_batches):
            start = j * self.batch_size
            ctx = [list(c) for c in contexts[start:start + self.batch_size]]
            comp = [list(c) for c in completions[start:start + self.batch_size]]
            r = self._run(self._batch(ctx, comp, pool, n, multi))
            out_lp += [np.asarray(r["logprobs"][i, len(a): len(a) + len(b)]) for i, (a, b) in enumerate(zip(ctx, comp))]
            for k, v in parts.items():
                v.append(r[k][: len(ctx)])
        if not parts["sum"]:  # no rows (only on a process of a multi-process call)
            zero = np.zeros(0, np.float32)
            return ScoreResult([], zero, zero, zero, np.zeros((0, self.cfg.hidden_size), np.float32))
        res = ScoreResult(out_lp, *(np.concatenate(parts[k]) for k in ("sum", "mean", "geo_mean", "pooled")))
        return res

    def _score_grouped(self, contexts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], g: int
                       ) -> ScoreResult:
        """`score` of contexts in runs of g (`context_groups`): each context runs once (`score_grouped`).

        Under a mesh within one process the context rows (padded to a multiple of the row shards)
        and their completion rows are split over (data, fsdp) like any batch.
        """
        from jaxrl_mt.parallel import fetch_rows, row_shards

        n = len(contexts)
        m = row_shards(self.mesh)
        rows = n if n <= self.batch_size else self.batch_size  # a multiple of g
        max_ctx = self.cfg.max_position_embeddings
        p = bucket(max(len(c) for c in contexts), 16)
        c = bucket(max(max((len(x) for x in completions), default=1), 1), 16)
        if max(len(a) + len(b) for a, b in zip(contexts, completions)) > max_ctx:
            raise ValueError(f"a context+completion exceeds the model context {max_ctx}")
        out_lp: list[np.ndarray] = []
        parts: dict[str, list[np.ndarray]] = {"sum": [], "mean": [], "geo_mean": [], "pooled": []}
        for start in range(0, n, rows):
            ctx = [list(x) for x in contexts[start:start + rows:g]]
            comp = [list(x) for x in completions[start:start + rows]]
            bp = -(-bucket(len(ctx), 1) // m) * m
            pt, pm = pack_rows(ctx, self.pad_id, p, align="left", n_rows=bp)
            pm[len(ctx):, -1] = True  # padding groups: one real token, so no row attends to nothing
            st, sm = pack_rows(comp, self.pad_id, c, align="right", n_rows=bp * g)
            r = fetch_rows(score_grouped(self.params, self.cfg, *self._place([pt, pm, st, sm]), chunk=self.chunk))
            out_lp += [np.asarray(r["logprobs"][i, :len(x)]) for i, x in enumerate(comp)]
            for k, v in parts.items():
                v.append(r[k][: len(comp)])
        return ScoreResult(out_lp, *(np.concatenate(parts[k]) for k in ("sum", "mean", "geo_mean", "pooled")))


def cosine(a: np.ndarray, b: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Row-wise cosine similarity of [N, D] and [N, D] (or [D]) arrays."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    num = np.sum(a * b, axis=-1)
    return num / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + eps)


def embed_texts(scorer: Scorer, tokenizer: Any, texts: Sequence[str]) -> np.ndarray:
    """Pooled hidden-state embeddings [N, D] of plain texts, through the same scorer."""
    ids = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) or [scorer.pad_id] for t in texts]
    return scorer.score([[]] * len(ids), ids, pool="completion").pooled

"""Exploratory (session 7): hidden-state features of the embedded model for labelled replies (see fit.py).

``PYTHONPATH=. python tests/rewards/judge_real/probe/features.py OUT.npz FILE.jsonl [FILE.jsonl ...]``
writes, per reply in file order: the final-norm hidden state at the generation point and the
mean over the prompt (``feats`` [N, 2D]), the log-probabilities of yes / no there (``yesno``),
``ids`` and ``labels``.
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.models.decoder import forward, lm_head
from jaxrl_mt.models.registry import DEFAULT_MODEL, load_model

PROMPT = ("A math word problem: {q}\n\nThe user's latest message: {u}\n\nThe assistant replied: {t}\n\n"
          "Does the assistant's reply commit to one final number as the answer to the question? Answer yes or no.")
BATCH = 16


def main(out: str, files: list[str]) -> None:
    recs = [json.loads(x) for f in files for x in open(f, encoding="utf-8") if x.strip()]
    m = load_model(DEFAULT_MODEL)
    tok = m.tokenizer
    ids = [encode_prompt(tok, [{"role": "user", "content": PROMPT.format(
        q=r.get("question") or "", u=r.get("user") or "", t=r["text"])}])[-640:] for r in recs]
    yes = [tok.encode(w)[-1] for w in (" yes", "yes", "Yes")]
    no = [tok.encode(w)[-1] for w in (" no", "no", "No")]

    @jax.jit
    def run(tokens, mask):
        pos = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
        _, h, _ = forward(m.params, m.cfg, tokens, pos, mask.astype(bool), logits="none")  # [B, T, D]
        w = mask[..., None]
        return h[:, -1], (h * w).sum(1) / w.sum(1), lm_head(m.params, m.cfg, h[:, -1])

    order = np.argsort([len(x) for x in ids])
    feats = np.zeros((len(recs), 2 * m.cfg.hidden_size), np.float32)
    yesno = np.zeros((len(recs), 2), np.float32)
    t0 = time.time()
    for s in range(0, len(order), BATCH):
        idx = order[s:s + BATCH]
        width = -(-max(len(ids[i]) for i in idx) // 64) * 64
        tokens = np.full((len(idx), width), m.cfg.pad_token_id or 0, np.int32)
        mask = np.zeros((len(idx), width), np.int32)
        for j, i in enumerate(idx):  # left padded: the last position is the generation point
            tokens[j, width - len(ids[i]):] = ids[i]
            mask[j, width - len(ids[i]):] = 1
        last, mean, logits = run(jnp.asarray(tokens), jnp.asarray(mask))
        feats[idx] = np.concatenate([np.asarray(last), np.asarray(mean)], 1)
        logits = np.asarray(logits)
        yesno[idx, 0] = np.logaddexp.reduce(logits[:, yes], 1)
        yesno[idx, 1] = np.logaddexp.reduce(logits[:, no], 1)
        if s % 160 == 0:
            print(s, len(recs), round(time.time() - t0), flush=True)
    np.savez(out, feats=feats, yesno=yesno, ids=np.array([r["id"] for r in recs]),
             labels=np.array([r["label"] for r in recs]))
    print("done", round(time.time() - t0))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

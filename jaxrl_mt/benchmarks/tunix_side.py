"""The tunix side of ``python -m jaxrl_mt.benchmarks tunix``: run as a script in tunix's own venv.

    .venv-tunix/bin/python jaxrl_mt/benchmarks/tunix_side.py --job JOB.json --out OUT.json

It imports tunix, jax and numpy only, never jaxrl_mt (tunix's pins are not ours): the model comes
from the HF folder (config.json + model.safetensors) through tunix's own loader
(`tunix.models.llama3.params.create_model_from_safe_tensors`) into tunix's `Llama3` model, and the
prompts (token ids) come from the job file that the parent process writes.

Job fields: ``hf_dir``, ``prompts`` (lists of ids), ``new_tokens``, ``prompt_len`` (the padded
prompt width), ``repeats``, ``pad_id``. The output holds the greedy tokens [B, N] of the timed call,
the wall times of the N-token and the 1-token calls (first call apart: it compiles), and the
logits [B, V] at each prompt's last position from one uncached forward (OUT.json.logits.npy).

tunix's sampler takes strings and tokenizes them itself, so the prompts go through `IdsTokenizer`
(space-separated ids, no BOS). It masks every prompt token equal to the pad id (pad id 2 = EOS in
SmolLM2, so prompts must not contain it) and stops rows at its EOS ids: -1 is passed so that every
row produces exactly N tokens, as `benchmarks sampling` forces on both sides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


class IdsTokenizer:
    """The tokenizer tunix's `TokenizerAdapter` accepts (encode / decode / bos_id / eos_id / pad_id) on ids."""

    def __init__(self, pad_id: int):
        self._pad = pad_id

    def encode(self, text: str, **_: Any) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids: list[int], **_: Any) -> str:
        return " ".join(str(int(t)) for t in ids)

    def bos_id(self) -> None:
        return None  # falsy: tunix prepends no BOS

    def eos_id(self) -> int:
        return self._pad

    def pad_id(self) -> int:
        return self._pad


def llama3_config(hf_dir: str, remat: str = "none") -> Any:
    """tunix's `llama3.model.ModelConfig` from an HF Llama config.json (tied embeddings, RoPE theta, heads)."""
    from tunix.models.llama3 import model as model_lib

    c = json.loads((Path(hf_dir) / "config.json").read_text())
    return model_lib.ModelConfig(
        num_layers=c["num_hidden_layers"], vocab_size=c["vocab_size"], embed_dim=c["hidden_size"],
        hidden_dim=c["intermediate_size"], num_heads=c["num_attention_heads"],
        head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
        num_kv_heads=c["num_key_value_heads"], rope_theta=int(c["rope_theta"]), norm_eps=c["rms_norm_eps"],
        weight_tying=bool(c.get("tie_word_embeddings", False)),
        remat_config=model_lib.RematConfig[remat.upper()])


def patch_rope_theta(theta: float) -> None:
    """Makes tunix's Llama3 attention use the config's RoPE theta.

    tunix 0.1.7's `llama3.model.Attention.block` calls the module's `apply_rope` without
    `rope_theta`, so its default 1e6 is used whatever `ModelConfig.rope_theta` says (SmolLM2: 1e5;
    logits off by ~1.2 against transformers without this). The module-level function is rebound
    with the config's theta; the computation is otherwise tunix's own.
    """
    import functools

    from tunix.models.llama3 import model as model_lib

    orig = getattr(model_lib.apply_rope, "__wrapped__", model_lib.apply_rope)
    patched = functools.partial(orig, rope_theta=theta)
    patched.__wrapped__ = orig  # type: ignore[attr-defined]
    model_lib.apply_rope = patched


def load(hf_dir: str, remat: str = "none") -> tuple[Any, Any]:
    """(tunix Llama3 model in float32, its config) from the HF folder; `remat`: tunix's RematConfig name."""
    import jax.numpy as jnp
    from tunix.models.llama3 import params as params_lib

    cfg = llama3_config(hf_dir, remat)
    patch_rope_theta(cfg.rope_theta)
    return params_lib.create_model_from_safe_tensors(hf_dir, cfg, dtype=jnp.float32), cfg


def last_logits(model: Any, prompts: list[list[int]], width: int, pad_id: int) -> Any:
    """[B, V] logits at each left-padded prompt's last position, uncached forward (tunix's own masks)."""
    import jax.numpy as jnp
    import numpy as np
    from tunix.generate import utils

    ids = np.full((len(prompts), width), pad_id, np.int32)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = p
    mask = jnp.asarray(ids != pad_id)
    positions = utils.build_positions_from_mask(mask)
    attn = utils.make_causal_attn_mask(mask, width)
    logits, _ = model(jnp.asarray(ids), positions, None, attn)
    return np.asarray(logits[:, -1, :], np.float32)


def timed(fn: Any, repeats: int) -> dict[str, Any]:
    """First call and the median / best of `repeats` more, in seconds; the last output."""
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return {"first_s": first, "steady_s": statistics.median(times), "best_s": min(times), "times": times,
            "out": out}


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Loads the model, checks logits, times greedy decodes of N and 1 tokens with tunix's `Sampler`."""
    import jax
    import numpy as np
    from tunix.generate import sampler as sampler_lib

    t0 = time.perf_counter()
    model, cfg = load(job["hf_dir"])
    load_s = time.perf_counter() - t0
    prompts, n, width, pad = job["prompts"], job["new_tokens"], job["prompt_len"], job["pad_id"]
    logits = last_logits(model, prompts, width, pad)
    cache = sampler_lib.CacheConfig(cache_size=width + n, num_layers=cfg.num_layers,
                                    num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
    sampler = sampler_lib.Sampler(model, IdsTokenizer(pad), cache)
    texts = [" ".join(map(str, p)) for p in prompts]

    def generate(steps: int) -> list[list[int]]:
        out = sampler(texts, max_generation_steps=steps, max_prompt_length=width, temperature=0.0,
                      eos_tokens=[-1], echo=False)
        return [np.asarray(t).tolist() for t in out.tokens]

    full, one = timed(lambda: generate(n), job["repeats"]), timed(lambda: generate(1), job["repeats"])
    tokens = full.pop("out")
    one.pop("out")
    return {"side": "tunix", "rope_theta_patched": True, "backend": jax.default_backend(), "load_s": load_s,
            "tokens": tokens,
            "lengths": [len(t) for t in tokens], "full": full, "one": one, "logits": logits}


def main() -> None:
    """Reads the job file, writes the result file."""
    here = Path(__file__).resolve().parent  # run as a script, its folder is sys.path[0]: its tunix.py would
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]  # shadow the tunix package
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import numpy as np

    r = run(json.loads(Path(a.job).read_text()))
    np.save(a.out + ".logits.npy", r.pop("logits"))
    Path(a.out).write_text(json.dumps(r))


if __name__ == "__main__":
    main()

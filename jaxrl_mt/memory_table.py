"""Training and sampling memory of big models: `python -m jaxrl_mt.memory_table --batch 8 --length 4096`.

Prints, for Qwen2.5-0.5B, -3B and -7B (configs below, from their published `config.json`), the
bytes of the parameters, gradients, AdamW state, KV cache and training activations at a given
batch (rows) and sequence length, with and without rematerialisation.

Exact terms (from the code that allocates them):
  * parameters: `models.decoder.param_shapes` x bytes of `--param-dtype`;
  * gradients: the same (`jax.grad` returns the parameter dtype);
  * optimizer state: `jax.eval_shape` of `rl.optim.make_optimizer(...).init` (AdamW: mu and nu
    in the parameter dtype, optax's default, plus int32 counters; `--grad-accum` > 1 adds
    optax.MultiSteps' accumulated gradient);
  * KV cache: `models.decoder.init_cache` = 2 (k, v) x L x B x S x Hkv x K x bytes(dtype) + B x S
    validity bits (bool bytes).

Estimated term (documented in docs/scaling.md): activations kept for the backward pass of the
GRPO loss (`rl.step.loss_fn`), per decoder layer (b = bytes of the compute dtype):

    layer(B, T) = B*T*b*(4*D + 3*Hq*K + 3*Hkv*K + 4*F)      # x, norm, x', norm'; q, q_rope, attn;
                                                            # k, k_rope, v; gate, silu, up, product
                + B*Hq*T*T*(4 + b)                           # fp32 scores + probabilities
    head(B)     = 3 * B * c * V * 4                          # one fp32 vocab chunk (c = 128), remat'd
    no remat:   L * layer(B, T) + head(B)
    remat:      L * B*T*D*b + layer(B, T) + head(B)          # scan carries only; one layer live

The estimate is of the einsum attention (`cfg.attention="einsum"`), whose scores are
materialised, so the T^2 term dominates long sequences; on a mesh, every term is divided by the
number of devices that split it (parameters, gradients and optimizer state by fsdp x tensor,
activations and cache by data x fsdp).

Measured mode (`--measured [--lengths 1024,2048,4096,8192] [--impls einsum,blockwise]
[--programs score,train,prefill] [--layers N] [--remat]`): compiles the scorer's forward
(`scoring.token_logprobs`), the train step's value-and-gradient of the mean token log-prob and
the sampler's prefill for shapes only (`jax.ShapeDtypeStruct` parameters: no weights) and
prints the temp and argument bytes of `compile().memory_analysis()` per attention
implementation, with the growth ratios between lengths, and the compiler (backend) that
produced them: the CPU compiler fuses differently from TPU's and GPU's.

Whole-step mode (`--measured --step [--models qwen2.5-1.5b,qwen2.5-7b] [--devices 1,8]
[--prompt-len 8192] [--remat dots] [--json OUT] [--markdown OUT]`): every program of the trainer's
RLSTA step at `configs/rlsta.py:paper_shapes`' sizes, compiled for abstract shapes on one device
and on FSDP meshes of host devices (`jaxrl_mt.benchmarks.step_memory`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import Sequence

import jax
import jax.numpy as jnp

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import init_cache, param_shapes

# Qwen2.5 base/instruct config.json values (Hugging Face Qwen/Qwen2.5-{0.5B,3B,7B}).
QWEN25 = {
    "Qwen2.5-0.5B": ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                                num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6, rms_norm_eps=1e-6,
                                tie_word_embeddings=True, attention_bias=True, max_position_embeddings=32768,
                                architecture="qwen2"),
    "Qwen2.5-3B": ModelConfig(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
                              num_heads=16, num_kv_heads=2, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                              tie_word_embeddings=True, attention_bias=True, max_position_embeddings=32768,
                              architecture="qwen2"),
    "Qwen2.5-7B": ModelConfig(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                              num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                              tie_word_embeddings=False, attention_bias=True, max_position_embeddings=32768,
                              architecture="qwen2"),
}
DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
LM_HEAD_CHUNK = 128  # scoring.token_logprobs' default time chunk


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    """Bytes of one model's training / sampling state at a batch and length."""

    name: str  # model name
    n_params: int  # parameter count
    params: int  # parameter bytes
    grads: int  # gradient bytes
    opt_state: int  # optimizer state bytes
    kv_cache: int  # KV cache bytes (batch rows x length slots)
    act_no_remat: int  # activation estimate without remat
    act_remat: int  # activation estimate with remat
    remat: bool  # which activation column the total uses
    lora: int = 0  # LoRA adapter bytes (rank `lora_rank`, every projection)
    lora_opt: int = 0  # their AdamW state

    @property
    def train_total(self) -> int:
        """Parameters + gradients + optimizer state + activations (the chosen remat setting)."""
        return self.params + self.grads + self.opt_state + self.activations

    @property
    def activations(self) -> int:
        return self.act_remat if self.remat else self.act_no_remat

    @property
    def rlsta_total(self) -> int:
        """Full fine-tuning with RLSTA's frozen reference: ``train_total`` plus a second copy of the weights."""
        return self.train_total + self.params

    @property
    def lora_total(self) -> int:
        """LoRA: the base weights (also the reference: no copy), adapters, their gradients and AdamW state."""
        return self.params + 2 * self.lora + self.lora_opt + self.activations


def n_params(cfg: ModelConfig) -> int:
    """Exact parameter count from `param_shapes`."""
    leaves = jax.tree_util.tree_leaves(param_shapes(cfg), is_leaf=lambda s: isinstance(s, tuple))
    return int(sum(math.prod(s) for s in leaves))


def _tree_bytes(tree) -> int:
    return int(sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def param_bytes(cfg: ModelConfig) -> int:
    """Bytes of the parameters in `cfg.param_dtype`."""
    return n_params(cfg) * jnp.dtype(cfg.param_dtype).itemsize


def opt_state_bytes(cfg: ModelConfig, *, grad_accum: int = 1) -> int:
    """Exact bytes of the trainer's optimizer state (`make_optimizer`), via `jax.eval_shape`."""
    from jaxrl_mt.rl.optim import make_optimizer

    abstract = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, cfg.jnp_param_dtype), param_shapes(cfg),
                                      is_leaf=lambda s: isinstance(s, tuple))
    opt = make_optimizer(1e-6, weight_decay=0.01, max_grad_norm=1.0, grad_accum_steps=grad_accum)
    return _tree_bytes(jax.eval_shape(opt.init, abstract))


def lora_bytes(cfg: ModelConfig, rank: int, *, grad_accum: int = 1) -> tuple[int, int]:
    """Exact bytes of the adapters of every projection (``models.lora``) and of their optimizer state."""
    from jaxrl_mt.models.lora import LoraConfig, init_adapters
    from jaxrl_mt.rl.optim import make_optimizer

    abstract = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, cfg.jnp_param_dtype), param_shapes(cfg),
                                      is_leaf=lambda s: isinstance(s, tuple))
    adapters = jax.eval_shape(lambda: init_adapters(abstract, LoraConfig(rank=rank), jax.random.key(0)))
    opt = make_optimizer(1e-6, weight_decay=0.01, max_grad_norm=1.0, grad_accum_steps=grad_accum)
    return _tree_bytes(adapters), _tree_bytes(jax.eval_shape(opt.init, adapters))


def kv_cache_bytes(cfg: ModelConfig, batch: int, length: int) -> int:
    """Exact bytes of `init_cache(cfg, batch, length)` (k, v, validity, index)."""
    return _tree_bytes(jax.eval_shape(lambda: init_cache(cfg, batch, length)))


def activation_bytes(cfg: ModelConfig, batch: int, length: int, *, remat: bool, chunk: int = LM_HEAD_CHUNK) -> int:
    """Estimated activation bytes of one GRPO loss backward pass (formula in the module docstring)."""
    b = jnp.dtype(cfg.dtype).itemsize
    B, T, D, F = batch, length, cfg.hidden_size, cfg.intermediate_size
    hq, hkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layer = B * T * b * (4 * D + 3 * hq + 3 * hkv + 4 * F) + B * cfg.num_heads * T * T * (4 + b)
    head = 3 * B * min(chunk, T) * cfg.vocab_size * 4
    if remat:
        return cfg.num_layers * B * T * D * b + layer + head
    return cfg.num_layers * layer + head


def memory_row(name: str, cfg: ModelConfig, batch: int, length: int, *, remat: bool = False,
               grad_accum: int = 1, lora_rank: int = 16) -> MemoryRow:
    """All columns of one model (the config's param_dtype and dtype apply)."""
    p = param_bytes(cfg)
    lo, lo_opt = lora_bytes(cfg, lora_rank, grad_accum=grad_accum)
    return MemoryRow(name=name, n_params=n_params(cfg), params=p, grads=p,
                     opt_state=opt_state_bytes(cfg, grad_accum=grad_accum),
                     kv_cache=kv_cache_bytes(cfg, batch, length),
                     act_no_remat=activation_bytes(cfg, batch, length, remat=False),
                     act_remat=activation_bytes(cfg, batch, length, remat=True), remat=remat, lora=lo,
                     lora_opt=lo_opt)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def format_table(rows: Sequence[MemoryRow], *, batch: int, length: int, param_dtype: str, dtype: str) -> str:
    """A markdown table, GiB (2^30 bytes)."""
    head = (f"batch {batch} x length {length}; parameters {param_dtype}, compute {dtype}; GiB; "
            f"total = params + grads + AdamW + activations ({'remat' if rows and rows[0].remat else 'no remat'}); "
            "LoRA: rank 16 on every projection, total = base params + adapters, their grads and AdamW + activations")
    cols = ["model", "params", "param", "grads", "AdamW state", "KV cache", "act. (no remat)", "act. (remat)",
            "train total", "+ ref copy (RLSTA)", "LoRA adapters", "LoRA total (ref = base)"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append(f"| {r.name} | {r.n_params / 1e9:.3f}B | {gib(r.params)} | {gib(r.grads)} | {gib(r.opt_state)} | "
                     f"{gib(r.kv_cache)} | {gib(r.act_no_remat)} | {gib(r.act_remat)} | {gib(r.train_total)} | "
                     f"{gib(r.rlsta_total)} | {gib(r.lora)} | {gib(r.lora_total)} |")
    return "\n".join(lines)


MEASURED_LENGTHS = (1024, 2048, 4096, 8192)
PROGRAMS = ("score", "train", "prefill")


@dataclasses.dataclass(frozen=True)
class Measured:
    """`memory_analysis()` of one compiled program (bytes, per device: one device here)."""

    name: str  # model name
    program: str  # "score" | "train" | "prefill"
    impl: str  # attention implementation (cfg.attention)
    length: int  # tokens per row
    temp: int  # temp_size_in_bytes: buffers live inside the program (activations)
    argument: int  # argument_size_in_bytes: parameters + inputs
    output: int  # output_size_in_bytes
    backend: str  # the compiler that produced it (jax.default_backend())


def _program(cfg: ModelConfig, program: str, remat: bool | str):
    """The jitted function of `program` and its abstract non-parameter arguments' builder."""
    from jaxrl_mt.models.decoder import forward, positions_from_mask
    from jaxrl_mt.scoring import token_logprobs

    def score(p, tok, mask):  # the scorer's forward (log-probs of every token)
        return token_logprobs(p, cfg, tok, mask, remat=remat)[0]

    def loss(p, tok, mask):  # the train step's differentiated term: mean token log-prob
        lp = token_logprobs(p, cfg, tok, mask, remat=remat)[0]
        return -jnp.sum(lp) / jnp.maximum(jnp.sum(mask), 1)

    def prefill(p, tok, mask, cache):  # the sampler's prefill into an empty cache
        logits, _, cache = forward(p, cfg, tok, positions_from_mask(mask), mask, cache, logits="last", fresh=True)
        return logits, cache

    return {"score": score, "train": jax.value_and_grad(loss), "prefill": prefill}[program]


def measure(name: str, cfg: ModelConfig, program: str, impl: str, length: int, *, batch: int = 1,
            remat: bool | str = False) -> Measured:
    """Compiles `program` for shapes only (jax.ShapeDtypeStruct parameters: no weights) and reads
    the compiled program's memory analysis."""
    cfg = cfg.replace(attention=impl)
    params = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, cfg.jnp_param_dtype), param_shapes(cfg),
                                    is_leaf=lambda s: isinstance(s, tuple))
    args = [params, jax.ShapeDtypeStruct((batch, length), jnp.int32), jax.ShapeDtypeStruct((batch, length), bool)]
    if program == "prefill":
        args.append(jax.eval_shape(lambda: init_cache(cfg, batch, length)))
    ma = jax.jit(_program(cfg, program, remat)).lower(*args).compile().memory_analysis()
    return Measured(name, program, impl, length, int(ma.temp_size_in_bytes), int(ma.argument_size_in_bytes),
                    int(ma.output_size_in_bytes), jax.default_backend())


def format_measured(rows: Sequence[Measured]) -> str:
    """One markdown row per (model, program, impl): temp GiB per length, the growth ratios, arguments."""
    lengths = sorted({r.length for r in rows})
    keys = list(dict.fromkeys((r.name, r.program, r.impl) for r in rows))
    by = {(r.name, r.program, r.impl, r.length): r for r in rows}
    ratio_cols = [f"{b}/{a}" for a, b in zip(lengths, lengths[1:])]
    cols = ["model", "program", "attention"] + [f"temp {n}" for n in lengths] + ratio_cols + ["arguments"]
    lines = [f"compiled by XLA:{rows[0].backend.upper() if rows else '?'}; GiB (2^30 bytes) per device",
             "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for key in keys:
        temps = [by[key + (n,)].temp for n in lengths]
        ratios = [f"{b / a:.2f}" if a else "n/a" for a, b in zip(temps, temps[1:])]
        arg = by[key + (lengths[-1],)].argument
        lines.append("| " + " | ".join(list(key) + [gib(t) for t in temps] + ratios + [gib(arg)]) + " |")
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run_measured(a: argparse.Namespace, names: Sequence[str], pd: str, cd: str) -> str:
    """The measured table of the models `names` (flags of `main`)."""
    rows = []
    for n in names:
        cfg = QWEN25[n].replace(param_dtype=pd, dtype=cd)
        if a.layers:
            cfg = cfg.replace(num_layers=a.layers)
        for program in a.programs.split(","):
            for impl in a.impls.split(","):
                for length in _int_list(a.lengths):
                    rows.append(measure(n, cfg, program, impl, length, batch=a.batch, remat=a.remat))
    head = (f"batch {a.batch}; parameters {pd}, compute {cd}; remat {a.remat}"
            f"{f'; {a.layers} layers' if a.layers else ''}")
    return head + "; " + format_measured(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--measured" in args and "--step" in args:  # the trainer's whole RLSTA step (benchmarks.step_memory)
        from jaxrl_mt.benchmarks.step_memory import main as step_main

        return step_main([a for a in args if a not in ("--measured", "--step")])
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.memory_table", description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8, help="sequences (rows) per step")
    ap.add_argument("--length", type=int, default=4096, help="tokens per sequence (also the KV-cache slots)")
    ap.add_argument("--param-dtype", default="fp32", help="fp32 | bf16")
    ap.add_argument("--dtype", default=None, help="compute dtype fp32 | bf16 (default: --param-dtype)")
    ap.add_argument("--remat", action="store_true", help="use the remat activations in the total")
    ap.add_argument("--grad-accum", type=int, default=1, help="micro-batches per update (MultiSteps state)")
    ap.add_argument("--models", default=",".join(QWEN25), help=f"comma-separated subset of {list(QWEN25)}")
    ap.add_argument("--measured", action="store_true",
                    help="compile the programs (shapes only) and print their memory_analysis() bytes")
    ap.add_argument("--lengths", default=",".join(map(str, MEASURED_LENGTHS)), help="--measured: tokens per row")
    ap.add_argument("--impls", default="einsum,blockwise", help="--measured: attention implementations")
    ap.add_argument("--programs", default="score,train", help=f"--measured: subset of {list(PROGRAMS)}")
    ap.add_argument("--layers", type=int, default=0, help="--measured: override the layer count (0: the model's)")
    a = ap.parse_args(argv)
    for flag, v in (("--param-dtype", a.param_dtype), ("--dtype", a.dtype)):
        if v is not None and v not in DTYPES:
            ap.error(f"{flag} must be one of fp32, bf16; got {v!r}")
    if a.batch < 1 or a.length < 1 or a.grad_accum < 1:
        ap.error(f"--batch, --length and --grad-accum must be >= 1, got {a.batch}, {a.length}, {a.grad_accum}")
    pd = DTYPES[a.param_dtype]
    cd = DTYPES[a.dtype or a.param_dtype]
    names = [n.strip() for n in a.models.split(",") if n.strip()]
    for n in names:
        if n not in QWEN25:
            ap.error(f"--models: unknown model {n!r}; known: {', '.join(QWEN25)}")
    if a.measured:
        for p in a.programs.split(","):
            if p not in PROGRAMS:
                ap.error(f"--programs: unknown program {p!r}; known: {', '.join(PROGRAMS)}")
        print(run_measured(a, names, pd, cd))
        return 0
    rows = [memory_row(n, QWEN25[n].replace(param_dtype=pd, dtype=cd), a.batch, a.length, remat=a.remat,
                       grad_accum=a.grad_accum) for n in names]
    print(format_table(rows, batch=a.batch, length=a.length, param_dtype=pd, dtype=cd))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The metrics of 3 training steps of every method on a tiny model, for a before/after comparison by hand.

Record each tree (e.g. a ``git worktree`` of the commit before a change, and the change), then compare::

    PYTHONPATH=/tmp/old python tests/rl/_three_steps.py record /tmp/before.json
    PYTHONPATH=$PWD python tests/rl/_three_steps.py record /tmp/after.json
    python tests/rl/_three_steps.py compare /tmp/before.json /tmp/after.json

Runs: rlsta, grpo, icpo, sft, dpo, rlaar, rlsta without a verifier, and variants (``NAME+section.field=JSON``:
LoRA, ``rl.grad_accum=2``, ``rl.remat=true``); SFT and DPO from cached rows (the tiny model solves nothing).
Every metric but timings is compared: bit-identical, else the worst relative difference. About 5 minutes
on 2 cores. ``THREE_STEPS_MODEL=builtin:smollm2-135m-instruct`` runs them on the embedded model instead.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

import jaxrl_mt  # noqa: E402
from jaxrl_mt.models.config import ModelConfig  # noqa: E402
from jaxrl_mt.models.decoder import init_params  # noqa: E402
from jaxrl_mt.models.hf_io import export_hf_folder  # noqa: E402
from jaxrl_mt.models.registry import DEFAULT_MODEL, load_model  # noqa: E402


def tiny_dir(root: Path) -> Path:
    """The conftest's tiny random Llama (the embedded tokenizer and chat template), saved under ``root``."""
    emb = load_model(DEFAULT_MODEL)
    cfg = ModelConfig(vocab_size=emb.cfg.vocab_size, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, tie_word_embeddings=True,
                      max_position_embeddings=4096, bos_token_id=1, eos_token_id=(2,), pad_token_id=2)
    params = init_params(cfg, jax.random.PRNGKey(0), scale=0.5)
    return export_hf_folder(cfg, params, root / "tiny-chat-llama", tokenizer=emb.tokenizer)


HIST = (("user", "Tom has 3 apples."), ("assistant", "OK, Tom has 3 apples."))


def sup_rows(kind: str, n: int) -> list[Any]:
    """``n`` cached SFT rows or DPO pairs (``tests/rl/test_supervised.py``'s)."""
    from jaxrl_mt.rl.sft_data import DpoPair, SftItem
    out = []
    for i in range(n):
        msgs = HIST + (("user", f"He buys {i + 1} more. How many now?"),)
        if kind == "sft":
            out.append(SftItem(f"p{i}|sharded|0", f"p{i}", msgs, f"3 + {i + 1} = {i + 4}. The answer is {i + 4}."))
        else:
            out.append(DpoPair(f"p{i}|sharded|0", f"p{i}", msgs, f"3 + {i + 1} = {i + 4}. The answer is {i + 4}.",
                               f"The answer is {i + 3}."))
    return out


def rl_common(c: Any, model: Path, wd: Path) -> Any:
    """A rollout method's config shrunk to 3 tiny steps."""
    c.model, c.workdir = str(model), str(wd)
    c.data.limit, c.data.heldout, c.data.max_turns = 4, 1, 4
    c.history.max_new_tokens = 6
    c.rl.steps, c.rl.batch_size, c.rl.group_size, c.rl.max_new_tokens = 3, 2, 2, 8
    c.rl.lr, c.rl.remat = 1e-3, False
    c.eval.max_new_tokens, c.eval.every = 6, 0
    c.checkpoint.every, c.log.samples_every, c.export = 1, 0, False
    return c


def config(name: str, model: Path, wd: Path) -> Any:
    """The config of run ``name`` (``METHOD`` or ``METHOD+section.field=JSON,...``)."""
    from configs import dpo, grpo, icpo, rlaar, rlsta, sft
    base, _, variant = name.partition("+")
    if base in ("sft", "dpo"):
        c = (sft if base == "sft" else dpo).get_config("cpu")
        c.model, c.workdir = str(model), str(wd)
        c.rl.steps, c.rl.batch_size, c.rl.lr = 3, 4, 1e-2
        c.eval.every, c.checkpoint.every, c.export = 1, 1, False
        wd.mkdir(parents=True, exist_ok=True)
        from jaxrl_mt.rl.supervised import _write_rows
        _write_rows(wd / "train_rows.jsonl", sup_rows(base, 8))
        _write_rows(wd / "val_rows.jsonl", sup_rows(base, 10)[8:])
    else:
        mod = {"rlsta": rlsta, "grpo": grpo, "icpo": icpo, "rlaar": rlaar, "rlsta_nv": rlsta}[base]
        c = rl_common(mod.get_config("no_verifier_cpu" if base == "rlsta_nv" else "cpu"), model, wd)
        if base == "rlsta":
            c.rl.beta = 0.04
        if base in ("icpo", "rlaar"):
            c.data.add_source, c.data.limit, c.data.heldout = "synthetic:8:0", 8, 1
            c.rl.max_new_tokens = 6
    for part in filter(None, variant.split(",")):
        k, v = part.split("=")
        sect, field = k.split(".")
        setattr(getattr(c, sect), field, json.loads(v))
    return c


NAMES = ["rlsta", "grpo", "icpo", "sft", "dpo", "rlaar", "rlsta_nv",
         "rlsta+rl.grad_accum=2", "rlsta+lora.rank=4", "sft+rl.grad_accum=2", "dpo+rl.grad_accum=2", "sft+lora.rank=4",
         "sft+rl.remat=true"]


def record(out_path: Path, names: list[str]) -> None:
    """Runs ``names`` (default: :data:`NAMES`) for 3 steps each and writes their metrics rows (timings dropped)."""
    from jaxrl_mt.rl.loop import Trainer

    print("jaxrl_mt from", jaxrl_mt.__file__, flush=True)
    with tempfile.TemporaryDirectory(prefix="three_steps_") as root:  # checkpoints: GBs on the embedded model
        tmp = Path(root)
        model = os.environ.get("THREE_STEPS_MODEL") or tiny_dir(tmp)  # e.g. builtin:smollm2-135m-instruct
        res = json.loads(out_path.read_text()) if out_path.exists() else {}
        for name in names or NAMES:
            t0 = time.time()
            wd = tmp / "".join(ch if ch.isalnum() else "_" for ch in name)
            Trainer(config(name, model, wd), log=lambda m: None).run()
            rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines() if x.strip()]
            res[name] = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]
            out_path.write_text(json.dumps(res, indent=1, sort_keys=True))
            shutil.rmtree(wd)
            print(f"{name}: {time.time() - t0:.1f}s, {len(rows)} rows", flush=True)


def _timing(key: str) -> bool:
    return key.endswith("seconds") or key.endswith("_s")


def compare(before: dict, after: dict) -> dict[str, dict[str, Any]]:
    """Per run: values compared (``n``), bit-identical ones (``same``), the worst relative difference
    (``worst``, at ``where``) and other mismatches (``other``: missing runs, rows, keys, non-float values)."""
    out: dict[str, dict[str, Any]] = {}
    for name, ra in before.items():
        if name not in after:
            out[name] = {"n": 0, "same": 0, "worst": math.inf, "where": None, "other": ["missing after"]}
            continue
        rb, n, same, worst, where, other = after[name], 0, 0, 0.0, None, []
        if len(ra) != len(rb):
            other.append(f"rows {len(ra)} vs {len(rb)}")
        for x, y in zip(ra, rb):
            if set(x) != set(y):
                other.append(f"step {x.get('step')} keys {sorted(set(x) ^ set(y))}")
            for k in set(x) & set(y):
                v, w = x[k], y[k]
                if _timing(k):
                    continue
                if isinstance(v, float) and isinstance(w, (int, float)):
                    n += 1
                    if v == w or (math.isnan(v) and math.isnan(w)):
                        same += 1
                    elif (r := abs(v - w) / max(abs(v), abs(w), 1e-30)) > worst:
                        worst, where = r, (x.get("step"), k, v, w)
                elif v != w:
                    other.append(f"step {x.get('step')} {k}: {v!r} vs {w!r}")
        out[name] = {"n": n, "same": same, "worst": worst, "where": where, "other": other}
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["compare"]:
        old, new = (json.loads(Path(a).read_text()) for a in sys.argv[2:4])
        for run, c in compare(old, new).items():
            print(f"{run}: {c['n']} values, {c['same']} bit-identical, worst relative {c['worst']:.3g} "
                  f"{c['where'] or ''} {c['other'][:3]}")
    else:
        record(Path(sys.argv[2]), sys.argv[3:])

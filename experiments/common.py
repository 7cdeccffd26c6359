"""Helpers shared by the experiment commands: the typed evaluation config and reading evaluation folders."""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxrl_mt.eval.eval_config import EvalConfig, typed_eval_config
from jaxrl_mt.eval.simulator import EvalError, TranscriptStore

ROOT = Path(__file__).resolve().parents[1]
EVAL_CONFIG = ROOT / "configs" / "eval_lic.py"
GREEDY_KINDS = ("full", "sharded", "mt_refine")
KIND_NAMES = {"full": "FULL", "sharded": "MT-Add", "mt_refine": "MT-Refine", "multi": "multi-turn", "avg": "average"}
# the accuracy tables' columns (the RLSTA paper's Table 1 and more): multi = mean of MT-Add and MT-Refine per problem,
# avg = mean of FULL, MT-Add and MT-Refine per problem (the paper's "Avg.")
TABLE_KINDS = (*GREEDY_KINDS, "multi", "avg")
CURVE_KEYS = (
    "reward/total",
    "reward/verifier_strict",
    "reward/verifier_lenient",
    "reward/anchor",
    "train/kl",
    "train/entropy",
    "probe/multi_turn_strict",
    "answer/distinct_numbers_final_line",
)
# The training-dynamics figure's curves (held-out accuracy over steps), key -> what it measures: the trainer's
# held-out items (`eval/`: full prompt; history + last turn) and the probe's real conversations (`probe/`).
DYNAMICS_KEYS = {
    "eval/single_turn_acc_strict": "single-turn: held-out items, full prompt",
    "probe/full_strict": "single-turn: probe, FULL",
    "eval/multi_turn_acc_strict": "multi-turn: held-out histories + last turn",
    "probe/multi_turn_strict": "multi-turn: probe, MT-Add + MT-Refine",
}


def eval_config(**overrides: Any) -> EvalConfig:
    """``configs/eval_lic.py:cpu`` with ``overrides`` applied (the file's keys), typed and checked as
    ``jaxrl_mt.evaluate`` types it (``typed_eval_config``).

    Raises:
      EvalError: the config file is missing (the experiment commands run from a source checkout),
        an override names a field the config does not have, or a value has the wrong type.
    """
    if not EVAL_CONFIG.is_file():
        raise EvalError(f"{EVAL_CONFIG}: not found (run the experiment commands from a source checkout)")
    spec = importlib.util.spec_from_file_location("_jaxrl_mt_eval_lic", EVAL_CONFIG)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    c = mod.get_config("cpu").to_dict()
    for k, v in overrides.items():
        if k not in c:
            raise EvalError(f"{EVAL_CONFIG}: no field {k!r}")
        c[k] = v
    return typed_eval_config(c)


def load_records(workdir: str | Path) -> list[dict[str, Any]]:
    """The transcript records of an evaluation folder, sorted by conversation id.

    Raises:
      EvalError: no ``transcripts.jsonl`` there, or a malformed line (file and line named).
    """
    path = Path(workdir) / "transcripts.jsonl"
    gz = path.with_name(path.name + ".gz")
    if not path.is_file() and gz.is_file():
        recs = {}
        with gzip.open(gz, "rt", encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        r = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise EvalError(f"{gz}:{i}: invalid JSON ({e.msg})") from None
                    recs[r["conv_id"]] = r
        return [r for _, r in sorted(recs.items())]
    if not path.is_file():
        raise EvalError(f"{path}: not found")
    return [r for _, r in sorted(TranscriptStore(path).load().items())]


def compress_transcripts(workdir: str | Path) -> Path:
    """Replaces ``transcripts.jsonl`` by ``transcripts.jsonl.gz`` (deterministic: no timestamp)."""
    path = Path(workdir) / "transcripts.jsonl"
    gz = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, open(gz, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
        dst.write(src.read())
    path.unlink()
    return gz


def evaluation_finished(workdir: str | Path) -> bool:
    """An evaluation workdir is finished once its transcripts were compressed (``compress_transcripts``)."""
    return (Path(workdir) / "transcripts.jsonl.gz").is_file()


def sha256_of(path: str | Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def refresh_copy(src: str | Path, dst: str | Path) -> bool:
    """Copies ``src`` to ``dst`` (atomically) when ``dst`` is missing or its checksum differs.

    A copy damaged on its way (or copied before its source was repaired) is replaced by the source.

    Returns:
      Whether ``dst`` was (re)written.
    """
    import os
    import shutil

    src, dst = Path(src), Path(dst)
    if dst.is_file() and sha256_of(dst) == sha256_of(src):
        return False
    tmp = dst.with_name(dst.name + ".copying")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return True


def write_json(path: str | Path, obj: Any) -> Path:
    """Writes ``obj`` as indented JSON (NaN as null) and returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_clean(obj), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return p


def _clean(x: Any) -> Any:
    import math

    import numpy as np

    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x

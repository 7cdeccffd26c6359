"""`evaluate` on 8 fake CPU devices: mesh (8,1,1) gives the one-device transcripts, with sharded rows.

The test starts this file as a script in a subprocess with 8 host devices (this pytest process
keeps its single device). The script evaluates a tiny chat model twice with the SeDT strategy
(earlier turns on the slot engine, each conversation's KV cache kept in its slot, then the
batched final turn with the scorer's embeddings), greedy: on one device (`mesh_shape="none"`)
and on mesh (8, 1, 1). It records the sharding of every scorer input and of the slot caches
every conversation turn is prefilled into (`sampling.slots.admit` / `extend` as `sampling.turns`
calls them). Compiling both meshes takes about a minute of CPU: marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _config(workdir: Path, model_dir: str, mesh_shape: str) -> dict:
    from configs.eval_lic import get_config

    c = get_config("cpu").to_dict()
    c.update(model=model_dir, dataset=("synthetic:3:0",), limit=3, scenarios=("full", "sharded"), runs=1,
             temperature=0.0, max_new_tokens=6, max_batch=8, strategy="sedt", protocol="final_turn",
             workdir=str(workdir), plots=False, bootstrap=10, mesh_shape=mesh_shape)
    return c


def worker(out: Path, model_dir: str) -> None:
    """Runs in the 8-device subprocess: both evaluations, the recorded shardings, the transcripts."""
    import jax

    from jaxrl_mt import scoring
    from jaxrl_mt.evaluate import evaluate
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.sampling import turns  # turns are prefilled into their slots' caches by turns.admit / extend

    seen: dict[str, list] = {"score": [], "cache": []}

    def placed(x) -> dict:
        """The rows and sharding of an input (a host array is not split: replicated)."""
        sh = getattr(x, "sharding", None)
        spec = [list(a) if isinstance(a, tuple) else a for a in getattr(sh, "spec", ())]
        return {"rows": int(x.shape[0]), "spec": spec, "replicated": sh is None or bool(sh.is_fully_replicated)}

    real_score, real_admit, real_extend = scoring.score_batch, turns.admit, turns.extend

    def score_batch(params, cfg, tokens, *a, **kw):
        seen["score"].append(placed(tokens))
        return real_score(params, cfg, tokens, *a, **kw)

    def admit(params, cfg, state, *a, **kw):
        seen["cache"].append(placed(state.cache.k))
        return real_admit(params, cfg, state, *a, **kw)

    def extend(params, cfg, state, *a, **kw):
        seen["cache"].append(placed(state.cache.k))
        return real_extend(params, cfg, state, *a, **kw)

    scoring.score_batch, turns.admit, turns.extend = score_batch, admit, extend
    model = load_model(model_dir)
    result: dict = {"devices": jax.device_count()}
    for name, mesh_shape in (("one", "none"), ("mesh", "8,1,1")):
        seen["score"], seen["cache"] = [], []
        wd = out.parent / name
        evaluate(_config(wd, model_dir, mesh_shape), model=model, log=lambda s: None)
        recs = [json.loads(line) for line in (wd / "transcripts.jsonl").read_text().splitlines()]
        result[name] = {"transcripts": {r["conv_id"]: [t["assistant"] for t in r["turns"]] for r in recs},
                        "sedt_turns": sum("sedt" in t for r in recs for t in r["turns"]),
                        "score": list(seen["score"]), "cache": list(seen["cache"])}
    out.write_text(json.dumps(result))


def test_mesh_shape_is_checked_at_start(tmp_path):
    from jaxrl_mt.eval.simulator import EvalError
    from jaxrl_mt.evaluate import normalize_config

    c = _config(tmp_path, "unused", "8,1,1")
    with pytest.raises(EvalError, match=r"config field 'mesh_shape': mesh_shape '8,1,1': .* needs 8 devices"):
        normalize_config(c)
    del c["mesh_shape"]
    assert normalize_config(c).mesh_shape == "auto"  # configs written before the field: all devices


@pytest.mark.slow
def test_evaluate_on_mesh_8_matches_one_device(tiny_chat_model_dir, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=str(ROOT))
    out = tmp_path / "result.json"
    r = subprocess.run([sys.executable, __file__, str(out), str(tiny_chat_model_dir)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=1200, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    got = json.loads(out.read_text())
    one, mesh = got["one"], got["mesh"]
    assert got["devices"] == 8
    assert len(one["transcripts"]) == 6 and one["sedt_turns"] == 3 == mesh["sedt_turns"]
    assert mesh["transcripts"] == one["transcripts"]  # greedy: the same conversations, turn by turn
    # one device: nothing sharded
    assert one["score"] and all(s["replicated"] for s in one["score"] + one["cache"])
    # mesh: every scorer batch and the slot caches split over the 8 devices, rows (slots) on (data, fsdp)
    assert mesh["score"] and all(s["rows"] % 8 == 0 and not s["replicated"] and s["spec"][0] == ["data", "fsdp"]
                                 for s in mesh["score"])
    assert mesh["cache"] and all(not c["replicated"] and c["spec"][1] == ["data", "fsdp"] for c in mesh["cache"])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    worker(Path(sys.argv[1]), sys.argv[2])

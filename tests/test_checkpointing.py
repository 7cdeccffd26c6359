"""Checkpointer: bit-exact round trips, retention, crash safety, sharded restore, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_mt.checkpointing import CheckpointError, Checkpointer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_state(seed: int = 0):
    """params (f32 + bf16), an optax adam state after one real update, step, typed + raw keys."""
    rng = np.random.default_rng(seed)
    params = {
        "dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32), "bias": jnp.zeros(3)},
        "embed": jnp.asarray(rng.normal(size=(5, 2)), jnp.bfloat16),
    }
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.5, params)
    _, opt_state = tx.update(grads, opt_state, params)
    return {
        "params": params,
        "opt_state": opt_state,
        "step": jnp.asarray(7, jnp.int32),
        "rng": jax.random.key(seed + 42),
        "np_rng": jax.random.PRNGKey(seed + 1),
    }


def to_bytes(tree):
    def leaf(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return (str(x.dtype), np.asarray(x).tobytes())

    return jax.tree.map(leaf, tree)


EXTRA = {"data": {"epoch": 1, "index": 123, "seed": 0}, "metrics": [{"step": 1, "reward": 0.25}]}


def test_roundtrip_is_bit_exact(tmp_path):
    state = make_state()
    ckpt = Checkpointer(tmp_path / "run")
    assert ckpt.latest_step() is None
    assert ckpt.save(7, state, EXTRA) is True
    ckpt.wait()
    ckpt.close()
    assert sorted(os.listdir(tmp_path / "run")) == ["7"]  # one directory per step, no probe left

    fresh = Checkpointer(tmp_path / "run")
    target = jax.tree.map(jnp.zeros_like, make_state(seed=5))  # same structure, other values
    restored, extra = fresh.restore(target=target)
    assert extra == EXTRA
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    assert type(restored["opt_state"][0]) is type(state["opt_state"][0])  # ScaleByAdamState
    assert to_bytes(restored) == to_bytes(state)
    assert restored["params"]["embed"].dtype == jnp.bfloat16
    assert jax.dtypes.issubdtype(restored["rng"].dtype, jax.dtypes.prng_key)
    # a restored key continues the same random stream
    np.testing.assert_array_equal(jax.random.normal(restored["rng"], (3,)), jax.random.normal(state["rng"], (3,)))
    # abstract targets work too
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    again, _ = fresh.restore(7, target=abstract)
    assert to_bytes(again) == to_bytes(state)
    fresh.close()


def test_max_to_keep_and_latest_step(tmp_path):
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        for step in (10, 20, 30, 40):
            state = make_state(seed=step)
            assert ckpt.save(step, state, {"step": step})
        ckpt.wait()
        assert ckpt.latest_step() == 40
        assert ckpt.all_steps() == [30, 40]
    assert sorted(os.listdir(tmp_path)) == ["30", "40"]
    with Checkpointer(tmp_path, read_only=True) as reader:
        assert reader.latest_step() == 40
        state, extra = reader.restore(30, target=make_state())
        assert extra == {"step": 30}
        assert to_bytes(state) == to_bytes(make_state(seed=30))


def test_save_interval_and_force(tmp_path):
    with Checkpointer(tmp_path, save_interval_steps=5) as ckpt:
        assert ckpt.save(5, make_state(), {}) is True
        assert ckpt.save(6, make_state(), {}) is False
        assert ckpt.save(7, make_state(), {}, force=True) is True
        ckpt.wait()
        assert ckpt.all_steps() == [5, 7]
        with pytest.raises(ValueError, match="step 7 already exists"):
            ckpt.save(7, make_state(), {}, force=True)


def test_mismatched_target_is_a_clear_error(tmp_path):
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, make_state(), EXTRA)
        ckpt.wait()
        target = make_state()
        del target["params"]["embed"]
        target["extra_leaf"] = jnp.zeros(2)
        with pytest.raises(ValueError, match=r"in target but not in checkpoint: \['extra_leaf'\]") as info:
            ckpt.restore(1, target=target)
        assert "in checkpoint but not in target: ['params/embed']" in str(info.value)
        assert str(tmp_path / "1") in str(info.value)
        target = make_state()
        target["params"]["dense"]["kernel"] = jnp.zeros((4, 4))
        with pytest.raises(ValueError, match=r"params/dense/kernel: checkpoint shape \(4, 3\), target shape \(4, 4\)"):
            ckpt.restore(1, target=target)
        with pytest.raises(FileNotFoundError, match=r"no step 2 .* \(available: \[1\]\)"):
            ckpt.restore(2, target=make_state())


def test_bad_inputs(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match=f"checkpoint directory {blocker / 'ckpt'} is not writable"):
        Checkpointer(blocker / "ckpt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Checkpointer(tmp_path / "nothing_here", read_only=True)
    with pytest.raises(ValueError, match="max_to_keep=0"):
        Checkpointer(tmp_path, max_to_keep=0)
    with Checkpointer(tmp_path / "ok") as ckpt:
        with pytest.raises(TypeError, match="extra for step 1 is not JSON-serialisable"):
            ckpt.save(1, make_state(), {"array": np.zeros(2)})
        with pytest.raises(FileNotFoundError, match="no checkpoint in"):
            ckpt.restore(target=make_state())


def _run(script: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=full_env, capture_output=True, text=True, timeout=300
    )


KILL_MID_SAVE = """
    import os, signal, sys, threading, time
    import jax, jax.numpy as jnp
    from jaxrl_mt.checkpointing import Checkpointer
    d = os.environ["CKPT_DIR"]
    ckpt = Checkpointer(d)
    ckpt.save(1, {"w": jnp.full((4,), 1.0)}, {"step": 1})
    ckpt.wait()

    def kill_when_tmp_appears():  # SIGKILL the moment step 2 exists only as a temporary dir
        while True:
            if any(n.startswith("2.orbax-checkpoint-tmp") for n in os.listdir(d)):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.0005)

    threading.Thread(target=kill_when_tmp_appears, daemon=True).start()
    big = jnp.ones((16, 1024, 1024), jnp.float32)  # 64 MiB: the write outlasts the watcher's poll
    ckpt.save(2, {"w": jnp.zeros(4), "big": big}, {"step": 2})
    ckpt.wait()
    print("SAVE FINISHED BEFORE THE KILL")
"""


def test_kill_mid_save_leaves_only_an_ignored_tmp_dir(tmp_path):
    d = tmp_path / "run"
    proc = _run(KILL_MID_SAVE, CKPT_DIR=str(d))
    assert proc.returncode == -9, proc.stdout + proc.stderr[-2000:]
    leftovers = [n for n in os.listdir(d) if n.startswith("2.orbax-checkpoint-tmp")]
    assert leftovers and "2" not in os.listdir(d)

    reader = Checkpointer(d, read_only=True)  # readers leave the leftover alone and ignore it
    assert reader.latest_step() == 1 and reader.all_steps() == [1]
    state, extra = reader.restore(target={"w": jnp.zeros(4)})
    np.testing.assert_array_equal(state["w"], np.ones(4))
    assert extra == {"step": 1}
    assert os.path.exists(d / leftovers[0])
    reader.close()

    with Checkpointer(d) as writer:  # a writer cleans it up (in the background) and can save step 2 again
        assert writer.latest_step() == 1
        writer.save(2, {"w": jnp.full((4,), 2.0)}, {"step": 2})  # awaits the cleanup first
        writer.wait()
        assert sorted(os.listdir(d)) == ["1", "2"]
        state, extra = writer.restore(target={"w": jnp.zeros(4)})
        np.testing.assert_array_equal(state["w"], np.full(4, 2.0))
        assert extra == {"step": 2}


SHARDED = """
    import os, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxrl_mt.checkpointing import Checkpointer
    assert jax.device_count() == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))
    x = jnp.arange(64.0).reshape(8, 8)
    state = {
        "w": jax.device_put(x, NamedSharding(mesh, P("data", "fsdp"))),
        "v": jax.device_put(x[0], NamedSharding(mesh, P())),
    }
    d = os.environ["CKPT_DIR"]
    with Checkpointer(d) as ckpt:
        ckpt.save(3, state, {"mesh": "2x2"})
    # restore with different shardings: the target decides
    target = {
        "w": jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(mesh, P(None, ("data", "fsdp")))),
        "v": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh, P("fsdp"))),
    }
    with Checkpointer(d) as ckpt:
        out, extra = ckpt.restore(target=target)
    assert extra == {"mesh": "2x2"}
    assert out["w"].sharding == target["w"].sharding, out["w"].sharding
    assert out["v"].sharding == target["v"].sharding, out["v"].sharding
    assert len(out["w"].addressable_shards) == 4 and out["w"].addressable_shards[0].data.shape == (8, 2)
    np.testing.assert_array_equal(np.asarray(out["w"]), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(out["v"]), np.asarray(x[0]))
    print("SHARDED OK")
"""


def test_sharded_save_and_restore_on_4_fake_devices(tmp_path):
    proc = _run(SHARDED, CKPT_DIR=str(tmp_path / "run"), XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert proc.returncode == 0 and "SHARDED OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]


# ----------------------------------------------------------------------------- faults


def _steps_1_2_3(d):
    """Saves steps 1, 2, 3 of a small tree whose values are the step number."""
    with Checkpointer(d, max_to_keep=3) as ckpt:
        for s in (1, 2, 3):
            ckpt.save(s, {"w": jnp.full((64, 8), float(s)), "b": jnp.full(5, float(s))}, {"step": s})
    return {"w": jnp.zeros((64, 8)), "b": jnp.zeros(5)}


def _damage(step_dir, how: str) -> None:
    if how == "truncated data":  # a partly written step: every array chunk cut in half
        for root, _, files in os.walk(step_dir / "state"):
            for f in files:
                if os.sep + "d" == root[-2:]:
                    os.truncate(os.path.join(root, f), os.path.getsize(os.path.join(root, f)) // 2)
    elif how == "truncated manifest":  # every pending array read fails: tensorstore's per-array reports
        os.truncate(step_dir / "state" / "manifest.ocdbt", 10)
    elif how == "deleted item":  # a partly deleted step
        import shutil

        shutil.rmtree(step_dir / "state")


@pytest.mark.parametrize("how", ["truncated data", "truncated manifest", "deleted item"])
def test_damaged_latest_step_falls_back_to_the_newest_that_restores(tmp_path, capfd, how):
    d = tmp_path / "run"
    target = _steps_1_2_3(d)
    _damage(d / "3", how)
    lines: list[str] = []
    with Checkpointer(d, max_to_keep=4) as ckpt:  # room for 3 steps and 3.unrestorable (it counts against keep)
        state, extra = ckpt.restore(target=target, on_skip=lines.append)
        # lost: step 3 only (the steps after the restored one are trained again)
        assert extra == {"step": 2} and float(state["w"][0, 0]) == 2.0
        assert len(lines) == 1 and "\n" not in lines[0], lines
        assert lines[0].startswith(f"checkpoint step 3 in {d} does not restore (")
        assert f"restored step 2 instead, and moved step 3 to {d / '3.unrestorable'}" in lines[0]
        assert ckpt.all_steps() == [1, 2]
        ckpt.save(3, {"w": jnp.full((64, 8), 9.0), "b": jnp.zeros(5)}, {"step": 3})  # the run can save step 3 again
        ckpt.wait()
        assert ckpt.restore(target=target)[1] == {"step": 3}
    assert sorted(os.listdir(d)) == ["1", "2", "3", "3.unrestorable"]
    assert "Traceback" not in capfd.readouterr().err  # no page of orbax / tensorstore tracebacks


def test_every_step_damaged_is_one_line_and_readers_move_nothing(tmp_path):
    d = tmp_path / "run"
    target = _steps_1_2_3(d)
    _damage(d / "3", "deleted item")
    lines: list[str] = []
    with Checkpointer(d, read_only=True) as reader:  # a reader falls back too but renames nothing
        assert reader.restore(target=target, on_skip=lines.append)[1] == {"step": 2}
    assert sorted(os.listdir(d)) == ["1", "2", "3"] and "moved" not in lines[0]
    with pytest.raises(CheckpointError, match=r"checkpoint step 3 in .* does not restore \(KeyError"):
        Checkpointer(d, read_only=True).restore(3, target=target)  # an explicit step: no fallback
    wrong = {**target, "extra_leaf": jnp.zeros(1)}  # a mismatched target is the caller's error, not damage
    with pytest.raises(ValueError, match="in target but not in checkpoint"):
        Checkpointer(d).restore(target=wrong)
    assert sorted(os.listdir(d)) == ["1", "2", "3"]
    _damage(d / "2", "truncated data")
    _damage(d / "1", "deleted item")
    with pytest.raises(CheckpointError) as info:
        Checkpointer(d).restore(target=target)
    msg = str(info.value)
    assert msg.startswith(f"no checkpoint in {d} restores: step 3: KeyError") and "\n" not in msg
    assert "; step 2: ValueError" in msg and "; step 1: KeyError" in msg
    assert sorted(os.listdir(d)) == ["1", "2", "3"]  # nothing moved when nothing restores


def _big(value: float):
    """600 KiB of incompressible floats (w[0] = value): one fits in 1 MiB, two do not."""
    w = np.random.default_rng(int(value)).normal(size=600 * 1024 // 4).astype(np.float32)
    w[0] = value
    return {"w": jnp.asarray(w)}


def test_save_on_a_full_disk_fails_before_writing_and_keeps_the_last_step(small_disk):
    d = small_disk / "ck"
    with Checkpointer(d, max_to_keep=1) as ckpt:
        assert ckpt.save(1, _big(1.0), {"step": 1})
        ckpt.wait()
        with pytest.raises(CheckpointError) as info:
            ckpt.save(2, _big(2.0), {"step": 2})
        msg = str(info.value)
        assert msg.startswith(f"not enough free space in {d} for checkpoint step 2: about 0.7 MB needed, 0.")
        assert msg.endswith("nothing written, the last checkpoint (step 1) is kept") and "\n" not in msg
        assert sorted(os.listdir(d)) == ["1"]  # lost: nothing on disk (the steps since step 1 in memory)
        state, extra = ckpt.restore(target=_big(0.0))
        assert extra == {"step": 1} and float(state["w"][0]) == 1.0


def test_failed_asynchronous_save_is_one_line_and_keeps_the_last_step(small_disk, monkeypatch, caplog):
    import jaxrl_mt.checkpointing as ck_mod

    d = small_disk / "ck"
    with Checkpointer(d, max_to_keep=1) as ckpt:
        ckpt.save(1, _big(1.0), {"step": 1})
        ckpt.wait()
        monkeypatch.setattr(ck_mod, "free_bytes", lambda _: 1 << 40)  # the disk fills after the check
        assert ckpt.save(2, _big(2.0), {"step": 2})  # returns at once; the write fails in the background
        with pytest.raises(CheckpointError) as info:
            ckpt.wait()
        msg = str(info.value)
        assert msg == (f"checkpoint step 2 could not be written to {d} (No space left on device); "
                       "the last checkpoint (step 1) is kept")
        ckpt.wait()  # reported once
        assert sorted(os.listdir(d)) == ["1"]  # the half-written step is removed, step 1 kept
        assert ckpt.restore(target=_big(0.0))[1] == {"step": 1}
        assert ckpt.save(2, {"w": jnp.zeros(4)}, {"step": 2})  # a smaller save succeeds afterwards
    assert not [r for r in caplog.records if r.levelname == "ERROR" and "orbax" in r.pathname]


def test_free_space_is_checked_before_a_save(tmp_path, monkeypatch):
    """The same refusal without a small disk: the free-space probe reports 100 kB."""
    import jaxrl_mt.checkpointing as ck_mod

    monkeypatch.setattr(ck_mod, "free_bytes", lambda _: 100_000)
    with Checkpointer(tmp_path / "ck") as ckpt:
        with pytest.raises(CheckpointError, match=r"about 0\.7 MB needed, 0\.1 MB free; nothing written, no earlier"):
            ckpt.save(1, _big(1.0), {"step": 1})
        assert ckpt.save(2, {"w": jnp.zeros(4)}, {}) is True  # 64 kB of metadata allowance + 16 bytes fit
    assert ck_mod.estimate_bytes({"k": jax.random.key(0), "x": np.zeros(1000, np.float32)}, {}) > 4000


def test_unrestorable_folders_count_against_max_to_keep(tmp_path):
    """Issue 32: before, `<step>.unrestorable` folders were never deleted nor counted by checkpoint.keep."""
    d = tmp_path / "run"
    target = _steps_1_2_3(d)
    _damage(d / "3", "deleted item")
    with Checkpointer(d, max_to_keep=2) as ckpt:
        assert ckpt.restore(target=target, on_skip=lambda _: None)[1] == {"step": 2}
        assert [p.name for p in ckpt.unrestorable()] == ["3.unrestorable"]
        ckpt.save(3, {"w": jnp.full((64, 8), 9.0), "b": jnp.zeros(5)}, {"step": 3})
        ckpt.wait()
    assert sorted(os.listdir(d)) == ["2", "3"]  # 2 folders in all: the unrestorable one went first


def test_orbax_records_of_a_damaged_step_are_deduplicated(tmp_path, caplog):
    """A step whose files are all zeroed: orbax logged its metadata error twice per step; now once."""
    d = tmp_path / "run"
    target = _steps_1_2_3(d)
    for root, _, files in os.walk(d / "3"):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "wb") as fh:
                fh.write(b"\0" * os.path.getsize(p))
    lines: list[str] = []
    with Checkpointer(d, read_only=True) as reader:
        assert reader.restore(target=target, on_skip=lines.append)[1] == {"step": 2}
    parse = [r for r in caplog.records if "Failed to json parse" in r.getMessage()]
    assert len(parse) == 1 and len(lines) == 1, [r.getMessage() for r in caplog.records]

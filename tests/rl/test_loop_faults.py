"""The training loop under faults (issue 19): a damaged latest checkpoint, a cut metrics line, a failed export."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import jax
import pytest

from configs.rlsta import get_config
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.models.hf_io import ExportError, export_hf_folder
from jaxrl_mt.rl import outputs as outputs_mod
from jaxrl_mt.rl.loop import Trainer
from jaxrl_mt.rl.metrics_log import MetricsLog
from jaxrl_mt.rl.outputs import write_outputs
from jaxrl_mt.rl.run_config import typed_config
from tests.rl.test_loop import tiny_config, train_rows

# 2 MB of float32 parameters: more than the 1 MiB disk of `small_disk` holds
BIG = ModelConfig(vocab_size=4096, hidden_size=64, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                  head_dim=32, tie_word_embeddings=False, bos_token_id=1, eos_token_id=(2,), pad_token_id=0)


def test_summary_is_written_before_a_failed_export_and_keeps_held_out_before(small_disk: Path) -> None:
    """A resumed run (no "before" evaluation of its own) whose export hits a full disk."""
    wd = small_disk / "run"
    wd.mkdir()
    log = MetricsLog(wd)
    log.tb = None
    log.scalars(0, {"eval/single_turn_acc_strict": 0.25})  # logged by the first, interrupted run
    log.scalars(1, {"reward/total": 0.5})
    (wd / "export").mkdir()
    (wd / "export" / "config.json").write_text("the previous export")
    c = get_config("cpu")
    c.workdir, c.export = str(wd), True
    with pytest.raises(ExportError) as info:
        write_outputs(typed_config(c), BIG, None, init_params(BIG, jax.random.key(0)),
                      {"after": {"eval/single_turn_acc_strict": 0.5}}, multi=False, is_main=True, log=print)
    assert str(info.value) == (f"cannot write the export folder {wd / 'export'} (No space left on device); "
                               "the previous folder is kept")
    summary = (wd / "summary.txt").read_text()
    assert "held-out before: single_turn_acc_strict=0.250\nheld-out after: single_turn_acc_strict=0.500\n" in summary
    assert "exported policy" not in summary
    assert os.listdir(wd / "export") == ["config.json"]  # lost: nothing (the checkpoint can be exported again)
    assert (wd / "export" / "config.json").read_text() == "the previous export"
    assert not [n for n in os.listdir(wd) if n.startswith(".export")]  # no temporary folder left


@pytest.mark.slow
def test_resume_over_damaged_checkpoint_and_cut_log_then_failed_export(tiny_chat_model_dir: Path, tmp_path: Path,
                                                                         monkeypatch) -> None:
    wd = tmp_path / "run"
    c = tiny_config(tiny_chat_model_dir, wd, steps=2)
    c.export = True
    Trainer(c).run()
    first = train_rows(wd)
    exported = {f.name: f.read_bytes() for f in (wd / "export").iterdir()}

    # faults: the latest checkpoint partly deleted, metrics.jsonl's last line ("eval after") cut in half
    shutil.rmtree(wd / "checkpoints" / "2" / "state")
    text = (wd / "metrics.jsonl").read_text()
    (wd / "metrics.jsonl").write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])
    # and the export fails (its target is unwritable: a path under a file)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setattr(outputs_mod, "export_hf_folder",
                        lambda cfg, params, out, **kw: export_hf_folder(cfg, params, blocker / "export", **kw))

    logs: list[str] = []
    with pytest.raises(ExportError) as info:
        Trainer(c, log=logs.append).run()
    assert str(info.value) == f"cannot write the export folder {blocker / 'export'} ({blocker} is a file, not a folder)"
    skipped = [ln for ln in logs if "does not restore" in ln]
    assert len(skipped) == 1 and "\n" not in skipped[0], logs
    assert skipped[0].startswith(f"checkpoint step 2 in {wd / 'checkpoints'} does not restore (KeyError: ")
    assert skipped[0].endswith(f"restored step 1 instead, and moved step 2 to {wd / 'checkpoints' / '2.unrestorable'}")
    assert f"resumed from {wd / 'checkpoints'} at step 1" in logs

    # lost: step 2's compute only; it is redone identically and checkpointed again
    again = train_rows(wd)
    assert sorted(again) == [1, 2]
    for k, v in first[2].items():
        if not k.startswith("perf/") and isinstance(v, float):
            assert math.isclose(v, again[2][k], rel_tol=1e-6, abs_tol=1e-6), (k, v, again[2][k])
    assert {"1", "2", "2.unrestorable"} <= {p.name for p in (wd / "checkpoints").iterdir()}
    # the summary is written before the export, and keeps the held-out "before" line of the first run
    summary = (wd / "summary.txt").read_text()
    assert "held-out before: " in summary and "held-out after: " in summary and "exported policy" not in summary
    assert {f.name: f.read_bytes() for f in (wd / "export").iterdir()} == exported  # the old export is untouched

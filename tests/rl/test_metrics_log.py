"""The metrics log of a run: resuming over a truncated last line, the held-out "before" line."""

from __future__ import annotations

import json

from jaxrl_mt.rl.metrics_log import MetricsLog, held_out_before, read_metrics


def test_resume_over_a_truncated_last_line(tmp_path, caplog):
    log = MetricsLog(tmp_path, enabled=True)
    log.tb = None  # TensorBoard is not under test
    log.scalars(0, {"eval/acc": 0.25})
    for step in (1, 2, 3):
        log.scalars(step, {"reward/total": step / 10})
    with open(log.jsonl, "a") as f:
        f.write('{"step": 4, "reward/total": 0.')  # killed while writing step 4
    assert [r["step"] for r in read_metrics(log.jsonl)] == [0, 1, 2, 3]  # a reader skips it, silently
    log.truncate_after(2)  # resuming from the checkpoint of step 2
    rows = [json.loads(ln) for ln in log.jsonl.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 3 and the cut step 4 are logged again
    warned = [r.getMessage() for r in caplog.records if "truncated last line" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"{log.jsonl}:5: dropping a truncated last line")
    log.scalars(3, {"reward/total": 0.3})
    assert [r["step"] for r in read_metrics(log.jsonl)] == [0, 1, 2, 3]
    assert held_out_before(read_metrics(log.jsonl)) == {"eval/acc": 0.25}
    assert held_out_before([{"step": 3, "eval/acc": 1.0}]) == {}

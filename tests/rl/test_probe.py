"""The latent-capability filter's breakdown and the held-out probe's plan (no model needed)."""

from __future__ import annotations

import pytest

from configs.rlsta import get_config
from jaxrl_mt.data.records import DataError
from jaxrl_mt.rl.probe import HeldoutProbe, filter_breakdown, make_probe


def test_filter_breakdown_names_every_reason() -> None:
    kinds = ["sharded", "mt_refine", "sharded", "sharded", "sharded", "mt_refine", "sharded"]
    st = [0.5, 0.75, 0.0, 1.0, 0.5, 0.25, 0.5]
    mt = [0.0, 0.25, 0.0, 1.0, 0.5, 0.5, 0.25]
    kept = [True, True, False, False, False, False, False]
    got = filter_breakdown(kinds, st, mt, kept)
    assert got == {"kept": 2, "kept_sharded": 1, "kept_mt_refine": 1, "dropped_never_solved": 1,
                   "dropped_always_solved": 1, "dropped_equal": 1, "dropped_multi_better": 1, "dropped_over_cap": 1}


def test_probe_plan_and_schedule() -> None:
    p = HeldoutProbe("family:heldout:4:1", limit=3, kinds=("full", "sharded", "mt_refine"), max_new_tokens=8, every=5)
    assert [k for _, k, _, _ in p.plan] == ["full", "sharded", "mt_refine"] * 3
    assert [p.due(d, 12) for d in (1, 5, 10, 11, 12)] == [False, True, True, False, True]
    with pytest.raises(DataError, match="no conversation"):
        HeldoutProbe("family:heldout:2:1", limit=0, kinds=(), max_new_tokens=8, every=0)


def test_make_probe_from_config() -> None:
    c = get_config("cpu")
    assert make_probe(c, None) is None
    c.eval.probe_source = "family:heldout:5:1"
    c.eval.probe_limit = 2
    c.eval.probe_every = 3
    p = make_probe(c, None)
    assert p is not None and len(p.plan) == 4 and p.every == 3  # 2 problems x (sharded, mt_refine)


def test_trainer_logs_the_filter_breakdown(tiny_chat_model_dir, tmp_path) -> None:
    """The real filtering stage on a random-weight model: it solves nothing, so every history is
    dropped as never solved, the breakdown says so, and the run stops with a clear error."""
    from jaxrl_mt.rl.loop import ConfigError, Trainer

    c = get_config("experiment")
    c.model, c.workdir = str(tiny_chat_model_dir), str(tmp_path / "run")
    c.data.add_source = c.data.refine_source = "family:train:3:1"
    c.history.max_new_tokens = c.rl.max_new_tokens = 4
    c.filter.k = 2
    c.eval.probe_source = ""
    lines: list[str] = []
    with pytest.raises(ConfigError, match="kept no history"):
        Trainer(c, log=lines.append).prepare()
    got = [x for x in lines if x.startswith("filtering breakdown:")]
    assert got == ["filtering breakdown: kept=0, dropped_never_solved=6, dropped_always_solved=0, dropped_equal=0, "
                   "dropped_multi_better=0, dropped_over_cap=0"]

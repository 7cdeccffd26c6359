"""The decode counters (`sampling.counters`): hand-worked values, and a real call's stats."""

import numpy as np

from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.sampling.counters import decode_counters, utilisation
from tests.test_row_keys import CFG, PROMPTS, _params


def test_counters_by_hand():
    # rows of 3 and 5 prompt tokens generate 4 and 2 tokens in a call of 4 rows, P = 8, N = 8 (one bucket: 16)
    c = decode_counters([3, 5], [4, 2], rows=4, prompt_bucket=8, new_bucket=8)
    assert c == {"row_steps": 12, "live_row_steps": 4, "slots_read": 192, "live_slots": (3 + 4 + 5) + 5}
    u = utilisation(c)
    assert u["row_utilisation"] == 4 / 12 and u["slot_utilisation"] == 17 / 192
    # S = 160: buckets 64, 128, 160; the write index runs 100, 101, ...; past 128 the step reads 160 slots
    assert decode_counters([90], [30], rows=1, prompt_bucket=100, new_bucket=60)["slots_read"] == 29 * 128
    assert decode_counters([90], [31], rows=1, prompt_bucket=100, new_bucket=60)["slots_read"] == 29 * 128 + 160
    assert decode_counters([4], [1], rows=2, prompt_bucket=8, new_bucket=8)["row_steps"] == 0


def test_a_real_call_reports_its_counters():
    s = Sampler(_params(), CFG, eos_ids=(), pad_id=0, max_batch=4)
    budgets = [5, 2, 9, 1]
    res = s.generate_ids(PROMPTS, SamplingConfig(max_new_tokens=9, temperature=0.0), seed=0, max_new_tokens=budgets)
    assert res.lengths.tolist() == budgets  # no stop ids: every row spends its budget
    st = res.stats
    # 4 slots: row 3 ends at its prefill, row 1 after 1 step (4 row-steps, then 2 slots); row 0 after 3
    # more (2 x 3, then 1 slot); row 2's last 4 (1 x 4): 14 executed, 13 needed
    assert st["row_steps"] == 4 + 6 + 4 and st["live_row_steps"] == sum(b - 1 for b in budgets)
    assert (st["admissions"], st["compactions"]) == (1, 2)
    assert st["row_utilisation"] == st["live_row_steps"] / st["row_steps"]
    assert 0 < st["slot_utilisation"] < 1
    assert np.isclose(st["new_tokens"], sum(budgets))

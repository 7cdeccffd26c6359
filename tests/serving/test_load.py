"""64 concurrent clients against the server on the embedded model (slow): all answered, faster in all.

The numbers of a full run (``python -m jaxrl_mt.serving.bench``) are in docs/serving.md.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_64_concurrent_clients_all_answered_and_batched(embedded_model):
    from jaxrl_mt.serving.bench import run_bench

    # A window far longer than the clients' arrival spread: the batch starts when all 64 are there.
    out = run_bench(embedded_model, clients=64, sequential=4, max_tokens=16, windows_ms=(5000.0,), lone=2)
    print(out)
    conc = out["concurrent"]["window_5000ms"]
    assert conc["answered"] == 64 and conc["errors"] == []
    assert conc["sampler_calls"] == 1 and conc["new_shapes_compiled"] == []  # all 64 in one (compiled) call
    assert conc["tok_per_s"] > 1.5 * out["one_at_a_time"]["tok_per_s"]
    assert 4900 < out["lone"]["window_5000ms"]["queue_wait_mean_ms"] < 6500  # a lone request waits out the window

"""The request batcher: which jobs share a sampler call, the batching window, stop strings, context."""

from __future__ import annotations

import asyncio

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.serving.batcher import Batcher, Job, cut_at_stops, split_to_fit
from tests.eval.test_simulator import counting_sampler


def test_cut_at_stops():
    assert cut_at_stops("abc. def", (".", "d")) == ("abc", True)
    assert cut_at_stops("abc", ("x",)) == ("abc", False)
    assert cut_at_stops("abc", ()) == ("abc", False)
    assert cut_at_stops("xyz", ("y", "xy")) == ("", True)  # the earliest occurrence wins


def test_split_to_fit_keeps_each_call_within_the_context():
    jobs = [Job(prompt=[1] * p, budget=b, temperature=0, top_p=1, seed=None) for p, b in
            ((4000, 10), (10, 4000), (20, 30), (3000, 50))]
    groups = split_to_fit(jobs, 4096)
    assert sorted(len(j.prompt) for g in groups for j in g) == [10, 20, 3000, 4000]
    for g in groups:
        assert max(len(j.prompt) for j in g) + max(j.budget for j in g) <= 4096
    assert len(groups) == 2  # 10 and 20 share (4020); 3000 cannot join the 4000-token budget, 4000 joins 3000


def test_jobs_are_grouped_by_sampling_settings_in_one_batch(tiny_model):  # noqa: F811
    sampler = counting_sampler(tiny_model, max_batch=8)
    prompt = encode_prompt(tiny_model.tokenizer, [{"role": "user", "content": "Count to three."}])

    async def run():
        batcher = Batcher(sampler, window_s=0.3, max_rows=64)
        batcher.start()
        jobs = ([Job(prompt, 8, 0.0, 1.0, seed=i) for i in range(6)]  # greedy: seeds do not matter
                + [Job(prompt, 8, 1.0, 1.0, seed=None) for _ in range(3)]
                + [Job(prompt, 8, 1.0, 1.0, seed=5, n=4)])
        out = await asyncio.gather(*(batcher.submit(j) for j in jobs))
        again = await batcher.submit(Job(prompt, 8, 1.0, 1.0, seed=5, n=4))
        await batcher.stop()
        return batcher, out, again

    batcher, out, again = asyncio.run(run())
    assert sorted(sampler.sizes) == [3, 4, 4, 6]  # greedy 6, unseeded 3, seeded 4; then the repeat alone
    assert batcher.stats["batches"] == 2  # the ten jobs arrived within one window
    greedy = {c[0].text for c in out[:6]}
    assert len(greedy) == 1 and all(len(c) == 1 for c in out[:6])
    assert [c.text for c in again] == [c.text for c in out[-1]]  # same seed, same replies
    assert len({c.text for c in out[-1]}) == 4 and all(c.completion_tokens >= 1 for c in out[-1])

"""The request batcher on the slot engine: refill between segments, methods, seeds, long prompts, stop strings.

Every reply is checked against a fresh `Sampler.generate_ids` of its prompt (exact tokens, the tiny
chat model): choice i of a job with seed s is generate_ids with seed s and row seed i.
"""

from __future__ import annotations

import asyncio

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.sampling import SamplingConfig
from jaxrl_mt.serving.batcher import Batcher, Job, cut_at_stops
from tests.eval.test_simulator import counting_sampler

NO_STOP: tuple[int, ...] = ()  # a reply runs its whole budget


def test_cut_at_stops():
    assert cut_at_stops("abc. def", (".", "d")) == ("abc", True)
    assert cut_at_stops("abc", ("x",)) == ("abc", False)
    assert cut_at_stops("abc", ()) == ("abc", False)
    assert cut_at_stops("xyz", ("y", "xy")) == ("", True)  # the earliest occurrence wins


def _prompt(model, text: str) -> list[int]:
    return encode_prompt(model.tokenizer, [{"role": "user", "content": text}])


def _ref(sampler, job: Job, i: int = 0) -> list[int]:
    """Choice i of `job` from a fresh generate_ids call."""
    res = sampler.generate_ids([job.prompt], job.sampling(job.budget), seed=job.seed or 0, row_seeds=[i],
                               stop_ids=[list(job.stop_ids)])
    return res.tokens[0]


def _serve(sampler, script, **kw):
    """Runs ``script(batcher, done)`` on a started batcher (``done``: jobs in the order they were
    answered); returns (the batcher, the script's result, done)."""
    done: list[Job] = []

    async def run():
        batcher = Batcher(sampler, **kw)
        batcher.start()

        async def submit(job):
            out = await batcher.submit(job)
            done.append(job)
            return out

        try:
            out = await script(submit, batcher)
            while not batcher.idle:  # the spell's counters are final once it is over
                await asyncio.sleep(0.001)
            return batcher, out
        finally:
            await batcher.stop()

    batcher, out = asyncio.run(run())
    return batcher, out, done


def test_a_freed_slot_is_refilled_while_a_long_reply_decodes(tiny_model):  # noqa: F811
    """Two slots: A (4 tokens) and B (120) start; C waits and takes A's slot; D arrives once A is answered
    and is admitted into the running spell. C and D are answered before B, in one spell."""
    sampler = counting_sampler(tiny_model, max_batch=2)
    p = _prompt(tiny_model, "Count to three.")
    jobs = {k: Job(p, b, 0.0, 1.0, seed=None, stop_ids=NO_STOP) for k, b in (("A", 4), ("B", 120), ("C", 4), ("D", 4))}

    async def script(submit, batcher):
        first = [asyncio.ensure_future(submit(jobs[k])) for k in "ABC"]
        await first[0]
        await submit(jobs["D"])
        await asyncio.gather(*first)

    batcher, _, done = _serve(sampler, script, window_s=0.2, max_rows=2, slice_tokens=4)
    assert [next(k for k, j in jobs.items() if j is d) for d in done] == ["A", "C", "D", "B"]
    assert batcher.stats["spells"] == 1 and batcher.stats["refills"] == 1 and batcher.max_rows_seen == 2
    for j in jobs.values():
        assert j.replies == [_ref(sampler, j)] and len(j.replies[0]) == j.budget


def test_a_seeded_request_gets_the_same_replies_alone_and_among_others(tiny_model):  # noqa: F811
    """A seeded sampled job of 3 choices, alone and among 5 requests of other prompts, budgets,
    temperatures and arrival times: the same tokens, those of generate_ids (seed, row seed i)."""
    sampler = counting_sampler(tiny_model, max_batch=4)
    seeded = dict(prompt=_prompt(tiny_model, "Tell me about the sea."), budget=12, temperature=1.0, top_p=0.9,
                  seed=7, n=3, stop_ids=NO_STOP)
    alone = Job(**seeded)
    _serve(sampler, lambda submit, b: submit(alone), window_s=0.0, max_rows=4, slice_tokens=4)
    others = [Job(_prompt(tiny_model, "word " * (5 * k)), 6 + 2 * k, 0.5 + 0.2 * k, 0.8, seed=None if k % 2 else k,
                  stop_ids=NO_STOP) for k in range(5)]
    among = Job(**seeded)

    async def script(submit, batcher):
        early = [asyncio.ensure_future(submit(j)) for j in others[:3]]
        await asyncio.sleep(0.05)
        mine = asyncio.ensure_future(submit(among))
        await asyncio.sleep(0.05)
        await asyncio.gather(mine, *early, *(submit(j) for j in others[3:]))

    batcher, _, _ = _serve(sampler, script, window_s=0.0, max_rows=4, slice_tokens=4)
    assert among.replies == alone.replies and len(alone.replies) == 3
    assert alone.replies == [_ref(sampler, alone, i) for i in range(3)]
    assert len({tuple(r) for r in alone.replies}) == 3  # each choice its own draws
    assert others[2].replies == [_ref(sampler, others[2])]  # a seeded other, too
    greedy = Job(seeded["prompt"], 12, 0.0, 1.0, seed=None, stop_ids=tuple(sampler.eos_ids))
    _serve(sampler, lambda submit, b: submit(greedy), window_s=0.0, max_rows=4)
    ref = sampler.generate_ids([greedy.prompt], SamplingConfig(max_new_tokens=12, temperature=0.0))
    assert greedy.replies == ref.tokens


def test_a_long_prompt_fed_in_pieces_gives_the_single_prefill_s_reply(tiny_model):  # noqa: F811
    """A prompt of 5 pieces of up to 32 tokens (each intermediate piece's token dropped): the greedy reply of
    one prefill, exactly; a short request sent meanwhile is answered first."""
    sampler = counting_sampler(tiny_model, max_batch=4)
    long = Job(_prompt(tiny_model, "one two three " * 60)[:150], 12, 0.0, 1.0, seed=None, stop_ids=NO_STOP)
    short = Job(_prompt(tiny_model, "hi"), 2, 0.0, 1.0, seed=None, stop_ids=NO_STOP)
    assert len(long.prompt) == 150 and len(short.prompt) <= 32

    async def script(submit, batcher):
        first = asyncio.ensure_future(submit(long))
        await asyncio.sleep(0)
        await asyncio.gather(first, submit(short))

    batcher, _, done = _serve(sampler, script, window_s=0.1, max_rows=4, slice_tokens=4, prefill_tokens=32)
    ref = sampler.generate_ids([long.prompt], SamplingConfig(max_new_tokens=12, temperature=0.0), stop_ids=[[]])
    assert long.replies == ref.tokens and done == [short, long]
    assert batcher.stats["prefill_pieces"] == 5 and batcher.stats["extensions"] >= 4


def test_a_job_of_another_method_is_not_starved(tiny_model):  # noqa: F811
    """While a greedy spell decodes, a sampled job arrives, then more greedy ones: the spell admits no
    more, and the sampled job's spell runs before the later greedy jobs'."""
    sampler = counting_sampler(tiny_model, max_batch=4)
    p = _prompt(tiny_model, "Name a colour.")
    busy = Job(p, 60, 0.0, 1.0, seed=None, stop_ids=NO_STOP)
    sampled = Job(p, 4, 1.0, 1.0, seed=3, stop_ids=NO_STOP)
    later = [Job(p, 4, 0.0, 1.0, seed=None, stop_ids=NO_STOP) for _ in range(2)]

    async def script(submit, batcher):
        first = asyncio.ensure_future(submit(busy))
        while not batcher.stats["segments"]:
            await asyncio.sleep(0.001)
        second = asyncio.ensure_future(submit(sampled))
        await asyncio.sleep(0.01)
        await asyncio.gather(first, second, *(submit(j) for j in later))

    batcher, _, done = _serve(sampler, script, window_s=0.0, max_rows=4, slice_tokens=4)
    assert done[:2] == [busy, sampled] and set(done[2:]) == set(later)
    assert batcher.stats["spells"] == 3 and sampled.replies == [_ref(sampler, sampled)]


def test_a_cancelled_job_stops_within_a_few_segments(tiny_model):  # noqa: F811
    sampler = counting_sampler(tiny_model, max_batch=4)
    job = Job(_prompt(tiny_model, "go on"), 400, 0.0, 1.0, seed=None, stop_ids=NO_STOP)

    async def script(submit, batcher):
        task = asyncio.ensure_future(submit(job))
        while not batcher.stats["segments"]:
            await asyncio.sleep(0.001)
        task.cancel()
        while not batcher.stats["spells"]:
            await asyncio.sleep(0.001)

    batcher, _, done = _serve(sampler, script, window_s=0.0, max_rows=4, slice_tokens=4)
    s = batcher.stats
    assert done == [] and job.replies is None and s["cancelled"] == 1 and s["stopped_rows"] == 1
    assert s["tokens"] == 0 and 1 <= s["decoded"] <= 6 * 4, dict(s)  # stopped within a few segments of 4 steps

"""The local model as a chat backend: memory-bounded chunks that do not change what it answers."""

from __future__ import annotations

from jaxrl_mt.local_backend import LocalBackend
from jaxrl_mt.models.registry import load_model
from tests.sampler_spy import RecordingSampler


def test_long_prompts_are_answered_in_bounded_chunks_with_the_same_replies(tiny_chat_model_dir):
    model = load_model(str(tiny_chat_model_dir))
    convs = [[{"role": "user", "content": "word " * n}] for n in (3, 400, 5, 380, 2, 390)]
    whole = LocalBackend(model, max_cells=10**12)  # one call for all rows
    small = LocalBackend(model, max_cells=2 * 512 * (512 + 16))  # at most 2 rows of the 512-token bucket
    counted = RecordingSampler(model.params, model.cfg, model.tokenizer, eos_ids=model.eos_ids, pad_id=model.pad_id,
                               max_batch=32)  # LocalBackend's sampler, counting the rows of each call
    small._chunked.sampler = counted
    got = small.chat(convs, max_new_tokens=8)
    assert got == whole.chat(convs, max_new_tokens=8)  # greedy: chunking changes nothing
    assert len(got) == 6 and max(counted.sizes) < 6 and sum(counted.sizes) == 6, counted.sizes

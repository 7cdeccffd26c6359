"""grain pipelines: batching, epochs, per-process sharding and checkpoint/resume."""

from __future__ import annotations

import itertools
import json

import pytest

from jaxrl_mt.data.loaders import asset_path, load_rlsta_add
from jaxrl_mt.data.pipeline import make_iterator
from jaxrl_mt.data.records import DataError
from jaxrl_mt.data.scenarios import build_scenario


@pytest.fixture(scope="module")
def scenarios():
    return [build_scenario(t, "sharded") for t in load_rlsta_add(asset_path("rlsta/mt_add_math_train_sample.jsonl"))]


def test_one_epoch_is_a_permutation(scenarios):
    batches = list(make_iterator(scenarios, batch_size=4, seed=0, num_epochs=1))
    assert len(batches) == 8 and all(isinstance(b, list) and len(b) == 4 for b in batches)
    seen = [s.task_id for b in batches for s in b]
    assert sorted(seen) == sorted(s.task_id for s in scenarios)
    assert seen != [s.task_id for s in scenarios]  # shuffled
    again = [s.task_id for b in make_iterator(scenarios, batch_size=4, seed=0, num_epochs=1) for s in b]
    assert again == seen
    other = [s.task_id for b in make_iterator(scenarios, batch_size=4, seed=1, num_epochs=1) for s in b]
    assert other != seen


def test_no_shuffle_keeps_order_and_drop_remainder():
    recs = list(range(10))
    got = list(make_iterator(recs, batch_size=3, seed=0, shuffle=False, num_epochs=1))
    assert got == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert list(make_iterator(recs, batch_size=3, seed=0, shuffle=False, num_epochs=1, drop_remainder=False))[-1] == [9]


def test_epochs_reshuffle():
    recs = list(range(12))
    flat = [x for b in make_iterator(recs, batch_size=4, seed=0, num_epochs=2) for x in b]
    e1, e2 = flat[:12], flat[12:]
    assert sorted(e1) == sorted(e2) == recs and e1 != e2


def test_per_process_shards_are_disjoint_and_even():
    recs = list(range(23))
    parts = [[x for b in make_iterator(recs, batch_size=2, seed=0, num_epochs=1, shard_index=i, shard_count=4)
              for x in b] for i in range(4)]
    assert all(len(p) == 4 for p in parts)  # 23 // 4 = 5 per process -> 2 batches of 2
    assert not set().union(*[set(a) & set(b) for a, b in itertools.combinations(parts, 2)])
    assert set().union(*map(set, parts)) <= set(range(20))  # the remainder (20..22) is dropped evenly


def test_state_saved_mid_epoch_resumes_identically(scenarios):
    it = make_iterator(scenarios, batch_size=3, seed=7)  # repeats forever
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # JSON-able, as a checkpoint would store it
    expected = [next(it) for _ in range(12)]  # crosses an epoch boundary (32 records, 3 per batch)
    fresh = make_iterator(scenarios, batch_size=3, seed=7)
    fresh.set_state(state)
    assert [next(fresh) for _ in range(12)] == expected
    # and a differently-seeded pipeline does not produce them
    other = make_iterator(scenarios, batch_size=3, seed=8)
    other.set_state(state)
    assert [next(other) for _ in range(12)] != expected


def test_bad_arguments():
    for kw in [dict(batch_size=0), dict(shard_index=2, shard_count=2), dict(num_epochs=0), dict(batch_size=11)]:
        args = dict(batch_size=2, seed=0) | kw
        with pytest.raises(DataError):
            make_iterator(list(range(10)), **args)

"""Records: validation, JSON round trips, kind aliases."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.data.loaders import load_scenarios_jsonl, load_tasks_jsonl, save_scenarios_jsonl, save_tasks_jsonl
from jaxrl_mt.data.records import DataError, Scenario, ShardedTask, canonical_kind


def _scenario(**kw) -> Scenario:
    d = dict(
        task_id="t/1",
        kind="underspecified",
        turns=("Tom has 5 apples. How many now?",),
        anchor_prompt="Tom has 5 apples. He buys 3. How many now?",
        answer="8",
        removed=(1,),
        metadata={"order": (0,), "n_shards": 3, "nested": {"a": [1, 2]}},
    )
    d.update(kw)
    return Scenario(**d)


def test_scenario_json_round_trip(tmp_path):
    s = _scenario()
    assert s.meta["nested"] == (("a", (1, 2)),)  # frozen, hashable
    hash(s)
    d = json.loads(json.dumps(s.to_json()))
    assert Scenario.from_json(d) == s
    p = tmp_path / "s.jsonl"
    save_scenarios_jsonl(p, [s, _scenario(kind="mt_add", removed=())])
    back = load_scenarios_jsonl(p)
    assert back[0] == s and back[1].kind == "sharded"


def test_task_json_round_trip(tmp_path):
    t = ShardedTask("t/2", "math", "How many?", ("A has 2.", "B has 3."), "A has 2. B has 3. How many?", "5",
                    corrupted=(None, "B has 4."), metadata={"source": "hand"})
    p = tmp_path / "t.jsonl"
    save_tasks_jsonl(p, [t])
    assert load_tasks_jsonl(p) == [t]
    assert t.meta == {"source": "hand"} and t.corrupted_indices == (1,)
    assert t.shards == ("How many?", "A has 2.", "B has 3.")


@pytest.mark.parametrize(
    "patch, expected",
    [
        ({"turns": []}, "x.jsonl:3: field 'turns': expected a non-empty list of non-empty strings"),
        ({"turns": ["ok", 3]}, "x.jsonl:3: field 'turns'"),
        ({"kind": "bogus"}, "x.jsonl:3: field 'kind': unknown scenario kind 'bogus'"),
        ({"answer": 8}, "x.jsonl:3: field 'answer': expected a string"),
        ({"removed": [-1]}, "x.jsonl:3: field 'removed'"),
        ({"metadata": []}, "x.jsonl:3: field 'metadata': expected an object"),
    ],
)
def test_scenario_from_json_errors(patch, expected):
    d = _scenario().to_json()
    d.update(patch)
    with pytest.raises(DataError) as e:
        Scenario.from_json(d, where="x.jsonl:3")
    assert str(e.value).startswith(expected)


def test_scenario_file_error_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    good = json.dumps(_scenario().to_json())
    bad = dict(_scenario().to_json(), turns="not a list")
    p.write_text(good + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=rf"^{p}:3: field 'turns': expected a non-empty list"):
        load_scenarios_jsonl(p)


def test_task_validation():
    with pytest.raises(DataError, match="field 'corrupted'"):
        ShardedTask("t", "math", "Q?", ("a 1.", "b 2."), "a 1. b 2. Q?", "3", corrupted=("a 2.",))
    with pytest.raises(DataError, match="field 'target'"):
        ShardedTask("t", "math", "  ", ("a 1.",), "a 1.", "3")
    with pytest.raises(DataError, match="field 'conditions'"):
        ShardedTask("t", "math", "Q?", ("",), "Q?", "3")


def test_kind_alias_and_unknown():
    assert canonical_kind("mt_add") == "sharded"
    assert canonical_kind("MT_REFINE") == "mt_refine"
    with pytest.raises(DataError, match=r"unknown scenario kind 'nope'; valid kinds: full, concat, sharded"):
        canonical_kind("nope")

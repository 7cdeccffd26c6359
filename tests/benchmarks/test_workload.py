"""`python -m jaxrl_mt.benchmarks workload`: the committed lengths, a damaged file, a tiny run."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.benchmarks.workload import DEFAULT_TRANSCRIPTS, committed_lengths, draw, main
from tests.test_sampling import tiny_hf_llama


def test_committed_lengths_of_exp2_base():
    pairs = committed_lengths(DEFAULT_TRANSCRIPTS)
    assert len(pairs) > 960  # every turn of the 960 conversations (multi-turn ones have several)
    assert all(p > 0 and 0 < n <= 128 for p, n in pairs)  # the experiment's budget was 128
    assert draw(pairs, 5, 1) == draw(pairs, 5, 1) != draw(pairs, 5, 2)


def test_a_damaged_line_is_named(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"turns": [{"prompt_tokens": 3, "new_tokens": 2}]}\n{"turns": [{"prompt_tokens": "x"}]}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: turns\[0\].prompt_tokens is not a count"):
        committed_lengths(f)


def test_tiny_run(tmp_path, capsys):
    folder = tmp_path / "tiny"
    tiny_hf_llama(folder)
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps({"turns": [{"prompt_tokens": p, "new_tokens": n}]}) + "\n"
                         for p, n in [(5, 3), (9, 7), (2, 1), (12, 4)]))
    out = tmp_path / "r.json"
    assert main(["--model", str(folder), "--transcripts", str(f), "--rows", "6", "--max-batch", "4",
                 "--repeats", "1", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    for e in ("chunks", "slots"):
        x = r[e]
        assert x["tokens_per_s"] == pytest.approx(r["new_tokens"] / x["steady_s"])
        assert 0 < x["row_utilisation"] <= 1
        assert x["live_row_steps"] == r["new_tokens"] - r["rows"]  # each row's first token is the prefill's
    assert 0 < r["chunks"]["slot_utilisation"] < 1 and 0 < r["slots"]["slot_utilisation"] <= 1
    assert r["speedup_slots"] == pytest.approx(r["chunks"]["steady_s"] / r["slots"]["steady_s"])
    assert "slots / chunks" in capsys.readouterr().out

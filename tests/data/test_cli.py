"""The ``python -m jaxrl_mt.data`` CLI and the segmenter report script."""

from __future__ import annotations

import json
import subprocess
import sys


from jaxrl_mt.data import report_segmenter
from jaxrl_mt.data.cli import main
from jaxrl_mt.data.loaders import asset_path, load_scenarios_jsonl


def test_build_and_inspect(tmp_path, capsys):
    out = tmp_path / "add.jsonl"
    assert main(["build", "--source", "synthetic:6:2", "--scenario", "mt_add", "--out", str(out), "--shuffle"]) == 0
    scen = load_scenarios_jsonl(out)
    assert len(scen) == 6 and {s.kind for s in scen} == {"sharded"}
    assert all(len(s.turns) == 4 for s in scen)  # target + start + 2 steps
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{out}: 6 scenarios" in text
    assert "kinds: sharded=6" in text
    assert "    4 | " in text and text.rstrip().count("\n") > 8
    assert "user  1: How many" in text


def test_build_refine_from_shipped_rlsta(tmp_path, capsys):
    out = tmp_path / "refine.jsonl"
    assert main(["build", "--source", "rlsta_refine:@", "--scenario", "mt_refine", "--out", str(out)]) == 0
    scen = load_scenarios_jsonl(out)
    assert len(scen) == 32 and scen[0].answer == "660"
    assert scen[0].turns[1] == "Correction, I got that wrong earlier: Gillian's usual phone bill is $50 per month"


def test_bad_kind_and_source_exit_2(tmp_path, capsys):
    assert main(["build", "--source", "synthetic:2", "--scenario", "mt_flip", "--out", str(tmp_path / "x")]) == 2
    assert "unknown scenario kind 'mt_flip'" in capsys.readouterr().err
    assert main(["build", "--source", "nope:1", "--scenario", "full", "--out", str(tmp_path / "x")]) == 2


def test_module_entry_point(tmp_path):
    out = tmp_path / "u.jsonl"
    cmd = [sys.executable, "-m", "jaxrl_mt.data", "build", "--source", "gsm8k:@", "--scenario", "underspecified",
           "--out", str(out), "--limit", "5"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wrote 5 underspecified scenarios" in r.stdout
    assert all(1 <= len(s.removed) <= 2 for s in load_scenarios_jsonl(out))


def test_report_segmenter_on_samples(tmp_path, capsys):
    js = tmp_path / "fig.json"
    assert report_segmenter.main([
        "--gsm8k", str(asset_path("gsm8k/train_sample.jsonl")),
        "--rlsta", str(asset_path("rlsta/mt_add_math_train_sample.jsonl")),
        "--json", str(js),
    ]) == 0
    fig = json.loads(js.read_text())
    assert fig["gsm8k"]["problems"] == 64 and fig["gsm8k"]["numbers_kept"] == 64 and fig["gsm8k"]["over_cap"] == 0
    assert fig["rlsta"]["problems"] == 32
    assert 0 < fig["rlsta"]["same_condition_numbers"] <= 32
    assert "every number kept (set):       64/64 = 100.00%" in capsys.readouterr().out


def test_inspect_a_source_spec_or_say_what_it_expects(tmp_path, capsys):
    lic = asset_path("lic/lic_math_format_sample.json")
    assert main(["inspect", str(lic)]) == 2  # a LiC JSON file is no scenario JSONL: say so, and what to type
    err = capsys.readouterr().err
    assert err == (f"error: {lic}:1: invalid JSON (Expecting value at column 1); it is a JSON document, not "
                   f"scenario JSONL: for a LiC file, inspect lic:{lic}[:task]\n")
    assert main(["inspect", f"lic:{lic}:math"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"lic:{lic}:math (3 tasks as sharded): 3 scenarios\nkinds: sharded=3\n")
    assert "example 0:\ntask sharded-GSM8K/1246  kind=sharded  turns=4  answer=3360" in out
    assert main(["inspect", "synthetic:2", "--scenario", "full"]) == 0
    assert "kinds: full=2" in capsys.readouterr().out
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}:1: invalid JSON") and "inspect expects a scenario JSONL file" in err
    assert "lic:FILE[:task], gsm8k:FILE" in err and err.count("\n") == 1

"""``experiments.reproduce.same_evaluation``: two evaluation folders compared record by record."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from experiments.common import compress_transcripts
from experiments.reproduce import same_evaluation, summary

RECS = [{"conv_id": f"t{i}|full|0", "task_id": f"t{i}", "kind": "full", "run": 0, "score": float(i % 2),
         "turns": [{"assistant": f"The answer is {i}."}]} for i in range(4)]
SCEN = {"full": {"P": 50.0, "ci": {"P": [0.0, 100.0]}}}


def _folder(root: Path, name: str, recs: list[dict], scen: dict | None, gz: bool = False,
            md: str = "| full | 50.0 |\n") -> Path:
    """An evaluation folder; ``scen`` None: no report.json (git-ignored, so absent in a new checkout)."""
    d = root / name
    d.mkdir()
    (d / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "report.md").write_text(md)
    if scen is not None:
        (d / "report.json").write_text(json.dumps({"scenarios": scen, "this_invocation": {"seconds": len(name)}}))
    if gz:
        compress_transcripts(d)
    return d


def test_the_same_records_in_another_order_and_file_form_are_identical(tmp_path: Path) -> None:
    ref = _folder(tmp_path, "ref", RECS, SCEN, gz=True)
    new = _folder(tmp_path, "new_longer_name", RECS[::-1], SCEN)  # a resumed run writes in another order
    res = same_evaluation(ref, new)
    assert res == {"n_ref": 4, "n_new": 4, "n_identical": 4, "different": [], "missing": [],
                   "scenarios_identical": True, "identical": True}
    assert summary("arm", res, ref, new).endswith("reproduced exactly")


def test_one_changed_reply_or_number_or_missing_conversation_is_found(tmp_path: Path) -> None:
    ref = _folder(tmp_path, "ref", RECS, SCEN)
    recs = copy.deepcopy(RECS)
    recs[2]["turns"][0]["assistant"] = "The answer is 3."
    res = same_evaluation(ref, _folder(tmp_path, "reply", recs, SCEN))
    assert (res["n_identical"], res["different"], res["identical"]) == (3, ["t2|full|0"], False)
    scen = {"full": {"P": 50.0, "ci": {"P": [0.0, 99.0]}}}
    res = same_evaluation(ref, _folder(tmp_path, "ci", RECS, scen))
    assert (res["n_identical"], res["scenarios_identical"], res["identical"]) == (4, False, False)
    res = same_evaluation(ref, _folder(tmp_path, "fewer", RECS[:3], SCEN))
    assert (res["missing"], res["identical"]) == (["t3|full|0"], False)
    assert "NOT reproduced" in summary("arm", res, ref, ref)


def test_without_the_reference_report_json_the_committed_report_md_is_compared(tmp_path: Path) -> None:
    ref = _folder(tmp_path, "ref", RECS, None)  # evaluated in an earlier checkout: report.json not committed
    res = same_evaluation(ref, _folder(tmp_path, "new", RECS, SCEN))
    assert (res["scenarios_identical"], res["identical"]) == (True, True)
    res = same_evaluation(ref, _folder(tmp_path, "md", RECS, SCEN, md="| full | 49.9 |\n"))
    assert (res["n_identical"], res["scenarios_identical"], res["identical"]) == (4, False, False)
    (ref / "report.md").unlink()
    with pytest.raises(FileNotFoundError, match="ref/report.md: no report.md"):
        same_evaluation(ref, tmp_path / "new")

"""Append-only JSONL logs after a crash: the cut last line is dropped (once, with one warning)."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.data.jsonl_log import read_jsonl_log

ROWS = [{"step": 1, "x": 0.5}, {"step": 2, "text": "é ü"}]


def _log(tmp_path, tail: bytes):
    p = tmp_path / "log.jsonl"
    p.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in ROWS) + tail)
    return p


@pytest.mark.parametrize("tail", [
    b'{"step": 3, "x": 0.2',  # cut mid-record
    b'{"step": 3, "m": {"a": 1}',  # cut right after a nested "}": ends in "}" and still not a record
    json.dumps({"step": 3, "text": "ü"}, ensure_ascii=False).encode()[:-3],  # cut inside a UTF-8 character
])
def test_a_cut_last_line_is_dropped_with_one_warning_and_removed(tmp_path, tail):
    p = _log(tmp_path, tail)
    warnings: list[str] = []
    assert [r for _, r in read_jsonl_log(p, warn=warnings.append)] == ROWS  # reading alone leaves the file
    assert p.read_bytes().endswith(tail) and len(warnings) == 1
    assert warnings[0].startswith(f"{p}:3: dropping a truncated last line (") and "\n" not in warnings[0]
    got = read_jsonl_log(p, repair=True, warn=warnings.append)
    assert [n for n, _ in got] == [1, 2] and [r for _, r in got] == ROWS
    assert p.read_bytes().count(b"\n") == 2 and p.read_bytes().endswith(b"\n")  # the cut line is gone
    with open(p, "a") as f:  # the record is redone on a line of its own
        f.write(json.dumps({"step": 3}) + "\n")
    warnings.clear()
    assert [r["step"] for _, r in read_jsonl_log(p, warn=warnings.append)] == [1, 2, 3] and not warnings


def test_a_complete_last_record_without_its_newline_is_kept(tmp_path):
    p = _log(tmp_path, b'{"step": 3}')  # cut between "}" and "\n"
    assert [r["step"] for _, r in read_jsonl_log(p, repair=True)] == [1, 2, 3]
    assert p.read_bytes().endswith(b'{"step": 3}\n')  # the next append starts its own line


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_bytes(b'{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"log\.jsonl:2: invalid JSON \(Expecting ',' delimiter at column 11\)"):
        read_jsonl_log(p, repair=True)
    p.write_bytes(b'{"step": 1}\n\xff\xfe\n{"step": 3}\n')
    with pytest.raises(KeyError, match=r"log\.jsonl:2: not UTF-8 \(byte 0\)"):
        read_jsonl_log(p, error=KeyError)
    assert p.read_bytes() == b'{"step": 1}\n\xff\xfe\n{"step": 3}\n'  # untouched
    assert read_jsonl_log(tmp_path / "missing.jsonl") == []

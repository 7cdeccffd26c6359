"""Issue 32, failure 8: a LiC file that is not UTF-8 or nested 200,000 deep is one DataError naming the file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import DataError


@pytest.mark.parametrize("content, message", [
    (b'[{"task_id": "a\xff", "task": "math"}]', "not UTF-8 (byte 15: b'\\xff')"),  # before: UnicodeDecodeError
    (b"[" * 200_000 + b"]" * 200_000, "a record is nested too deeply to parse"),  # before: RecursionError
    (b'[{"task_id": "x", "task": "math", "shards": "' + b"[" * 200_000 + b'"}]',
     "a record is nested too deeply to parse"),  # a Python-literal field (ast.literal_eval)
])
def test_unreadable_lic_file_is_one_line_naming_it(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "lic.json"
    path.write_bytes(content)
    t0 = time.thread_time()  # CPU time of this thread: a loaded host does not count
    with pytest.raises(DataError) as info:
        load_source(f"lic:{path}:math")
    assert str(info.value) == f"{path}: {message}"
    assert time.thread_time() - t0 < 2.0

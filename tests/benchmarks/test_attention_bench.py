"""The attention benchmark: its table arithmetic by hand and one tiny end-to-end run."""

from __future__ import annotations

import pytest

from jaxrl_mt.benchmarks import attention as bench


def test_format_rows_by_hand() -> None:
    a = bench._parser().parse_args(["--length", "100", "--batch", "2", "--repeats", "3"])
    rows = [{"impl": "einsum", "compile_s": 1.25, "times": [2.0, 1.0, 4.0], "peak_rss": 2**31, "backend": "cpu"},
            {"impl": "blockwise", "compile_s": 3.0, "times": [3.0, 3.0, 1.0], "peak_rss": 2**30, "backend": "cpu"}]
    lines = bench.format_rows(rows, a).splitlines()
    assert lines[0] == "score of 2 x 100 tokens, builtin:smollm2-135m-instruct, XLA:CPU, median of 3"
    assert lines[-2] == "| einsum | 1.2 | 2.000 | 100 | 2.00 | 1.00 |"
    assert lines[-1] == "| blockwise | 3.0 | 3.000 | 67 | 1.00 | 1.50 |"


def test_tiny_run_of_both_implementations(capsys: pytest.CaptureFixture) -> None:
    assert bench.main(["--length", "24", "--repeats", "1", "--block", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in out[-2:]] == ["| einsum", "| blockwise"]

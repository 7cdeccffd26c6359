"""The metrics of 3 training steps of every method and variant on the tiny model (``tests/rl/_three_steps.py``)
against those main gave before issue 52's changes (5909eaa), committed in ``tests/rl/data/``.

Recorded on an AMD EPYC host, where they are bit-identical; the test allows the issue's 1e-6 relative (XLA
may sum in another order on another kind of CPU). The runs compile at XLA's own optimisation level, as the
recording did (the suite's conftest lowers it for speed). Slow: about 5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rl._three_steps import NAMES, compare

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "data" / "three_steps_5909eaa.json"


@pytest.mark.slow
def test_three_steps_of_every_method_equal_main_before_the_training_side_change(tmp_path: Path) -> None:
    before = json.loads(GOLDEN.read_text())
    assert sorted(before) == sorted(NAMES)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "THREE_STEPS_MODEL")}
    env["PYTHONPATH"] = str(HERE.parents[1])  # configs/ and this tree's jaxrl_mt
    out = tmp_path / "after.json"
    subprocess.run([sys.executable, str(HERE / "_three_steps.py"), "record", str(out)], env=env, check=True,
                   cwd=HERE.parents[1], timeout=1800)
    result = compare(before, json.loads(out.read_text()))
    for name, c in result.items():
        assert not c["other"], (name, c["other"][:3])
        assert c["n"] > 10 and c["worst"] <= 1e-6, (name, c)

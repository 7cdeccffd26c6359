"""Plain GRPO on multi-turn histories: the RLSTA recipe with alpha = 0 (no anchor reward)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from rlsta import get_config as _rlsta  # noqa: E402


def get_config(preset: str = "paper"):
    c = _rlsta(preset)
    c.method = "grpo"
    c.rl.alpha = 0.0
    c.workdir = c.workdir.replace("rlsta", "grpo")
    return c

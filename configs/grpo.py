"""Plain GRPO on multi-turn histories: the RLSTA recipe with alpha = 0 (no anchor reward)."""

from pathlib import Path

from jaxrl_mt.runtime import load_config_file


def get_config(preset: str = "paper"):
    c = load_config_file(Path(__file__).with_name("rlsta.py"), preset)
    c.method = "grpo"
    c.reward = "grpo"  # the verifier alone (the anchor is still logged)
    c.rl.alpha = 0.0
    c.workdir = c.workdir.replace("rlsta", "grpo")
    return c

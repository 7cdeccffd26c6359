r"""RLAAR (RLSTA's Table 2 comparison): abstention-aware rewards with a competence-gated shard-count curriculum.

Each problem is asked in k turns (its shards grouped), solvable or with its last shard dropped
(unsolvable); the reward is 1 for `\boxed{abstain}` on an unsolvable sample and the verifier on a
solvable one (jaxrl_mt/rewards/abstain.py). The curriculum (jaxrl_mt/rl/rlaar.py, as RLAAR's public
code runs it): start at 1 shard, a 10-step window, threshold 0.8 x the first full window's mean
reward, one more shard when the window mean exceeds it and >= 10 steps passed, a random count in
[1, max_shards] once max_shards is reached. The system prompt tells the model how to abstain (our
wording: the paper's is not published). Presets: `paper` (RLSTA's GRPO settings), `cpu`, `experiment2` (issue
35's RLAAR arm: rlsta:experiment2's problems, budgets, LoRA, lr and probe; its system prompt is the chosen one
with the abstain instruction appended) and `experiment3` (issue 56's, the same from rlsta:experiment3).
Use: python -m jaxrl_mt.train --config configs/rlaar.py:cpu
"""

from pathlib import Path

from ml_collections import ConfigDict

from jaxrl_mt.rewards.abstain import ABSTAIN_INSTRUCTION, with_abstain
from jaxrl_mt.runtime import load_config_file


def get_config(preset: str = "paper") -> ConfigDict:
    if preset not in ("paper", "cpu", "experiment2", "experiment3"):
        raise ValueError(f"unknown preset {preset!r}; expected 'paper', 'cpu', 'experiment2' or 'experiment3'")
    c = load_config_file(Path(__file__).with_name("rlsta.py"), preset)
    chosen_system = c.system_prompt
    c.method = "rlaar"
    c.reward = "rlaar"
    c.workdir = c.workdir.replace("rlsta", "rlaar")
    c.system_prompt = ABSTAIN_INSTRUCTION
    c.rl.alpha = 0.0  # no anchor term
    c.rl.verifier_mode = "strict"
    c.filter.enabled = False  # no latent-capability filter: every problem is a sample
    c.data.refine_source = ""  # RLAAR's samples are sharded problems (data.add_source)
    c.rlaar = ConfigDict()
    c.rlaar.max_shards = 10
    c.rlaar.unsolvable_fraction = 0.5
    if preset == "cpu":
        c.data.add_source = "synthetic:16:0,rlsta_add:@"
        c.data.limit = 6
        c.data.heldout = 2
        c.rlaar.max_shards = 3
        c.rl.steps = 6
        c.eval.every = 0
    elif preset == "experiment2":
        c.system_prompt = with_abstain(chosen_system)
        c.data.add_source = "family:train:96:1,family:train:32:2"  # = rlsta's problems, as RLAAR samples
        c.rlaar.max_shards = 4  # the families' problems have 3-4 shards (the question + 2-3 facts)
        c.eval.every = 0
    elif preset == "experiment3":  # rlsta:experiment3's problems (data.add_source), budget, LoRA, lr and probe
        c.system_prompt = with_abstain(chosen_system)
        c.rlaar.max_shards = 5  # the arith problems have 3-5 shards (the question + 2-4 facts)
        c.eval.every = 0
    return c

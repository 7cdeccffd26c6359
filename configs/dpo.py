"""DPO baseline of RLSTA's Table 1: chosen = the correct single-turn response, rejected = the model's own
wrong multi-turn response on the same history (jaxrl_mt/rl/supervised.py), TRL's sigmoid loss.

The paper: lr 5e-7, batch 16, 1 epoch; beta 0.1 (TRL's default). `rl.steps` counts optimizer steps:
one epoch is rows / 16 (the run logs how many epochs its steps make). The reference is the frozen
initial policy (or `ref_model`). Presets: `paper`, `cpu` (embedded SmolLM2-135M, minutes on 2 cores),
`experiment2` / `experiment3` (issues 35's and 56's DPO arms).
Use: python -m jaxrl_mt.train --config configs/dpo.py:cpu
"""

from pathlib import Path

from ml_collections import ConfigDict

from jaxrl_mt.rl.run_config import ROLLOUT_KEYS
from jaxrl_mt.runtime import load_config_file

# experiment 3 (docs/results/experiment3_plan.md): 1 epoch of the data stage's training pairs at batch 4, a multiple
# of 4 (a checkpoint every quarter): 240 filtered items of 128 problems, 214 training pairs at seed 0
EXP3_STEPS = 56  # 1.05 epochs of 214 pairs


def get_config(preset: str = "paper") -> ConfigDict:
    if preset not in ("paper", "cpu", "experiment2", "experiment3"):
        raise ValueError(f"unknown preset {preset!r}; expected 'paper', 'cpu', 'experiment2' or 'experiment3'")
    c = load_config_file(Path(__file__).with_name("rlsta.py"), preset)
    c.method = "dpo"
    c.reward = ""  # no reward: preference pairs
    c.workdir = c.workdir.replace("rlsta", "dpo")
    for k in ROLLOUT_KEYS:  # no rollouts: no group size, rollout sampling, GRPO loss or reward weights
        del c.rl[k]
    c.dpo = ConfigDict()
    c.dpo.beta = 0.1  # DPO temperature (TRL's default)
    c.dpo.label_smoothing = 0.0
    c.dpo.val_fraction = 0.1
    if preset == "paper":
        c.rl.lr = 5e-7
        c.rl.batch_size = 16
        c.rl.steps = 40  # about 1 epoch of ~640 pairs; set it to rows / 16 for the data at hand
        c.eval.every = 10
    elif preset == "experiment2":  # rlsta:experiment2's items (filtered), budgets, LoRA, lr and probe
        c.rl.batch_size = 4
        c.rl.steps = 19  # the paper's 1 epoch: the data stage's 84 items give 76 training pairs (8 validation)
        c.eval.every = 5
        c.checkpoint.every = 10
    elif preset == "experiment3":  # rlsta:experiment3's items, budget, LoRA, lr, probe and checkpoint selection
        c.rl.batch_size = 4
        c.rl.steps = EXP3_STEPS  # the paper's 1 epoch of the data stage's training pairs
        c.eval.every = c.eval.probe_every = c.checkpoint.every = c.rl.steps // 4
    else:
        c.filter.enabled = False
        c.filter.k = 4
        c.filter.temperature = 0.7
        c.dpo.val_fraction = 0.25
        c.rl.batch_size = 2
        c.rl.steps = 6
        c.rl.lr = 1e-5
        c.eval.every = 2
        c.log.samples_every = 0
    return c

"""SFT baseline of RLSTA's Table 1: the correct single-turn response appended to the multi-turn history.

Data: RLSTA's histories (configs/rlsta.py's sources and latent-capability filter); for each, the
policy's first correct response to the full single-turn prompt among `filter.k` samples is the
target (jaxrl_mt/rl/supervised.py). The paper: lr 1e-6, batch 32, 5 epochs, the checkpoint with the
lowest validation loss (kept in <workdir>/best and exported). `rl.steps` counts optimizer steps:
5 epochs are 5 * rows / 32 steps (the run logs how many epochs its steps make).
Presets: `paper`, `cpu` (embedded SmolLM2-135M, minutes on 2 cores), `experiment2` (issue 35's SFT arm).
Use: python -m jaxrl_mt.train --config configs/sft.py:cpu
"""

from pathlib import Path

from ml_collections import ConfigDict

from jaxrl_mt.rl.run_config import ROLLOUT_KEYS
from jaxrl_mt.runtime import load_config_file


def get_config(preset: str = "paper") -> ConfigDict:
    if preset not in ("paper", "cpu", "experiment2"):
        raise ValueError(f"unknown preset {preset!r}; expected 'paper', 'cpu' or 'experiment2'")
    c = load_config_file(Path(__file__).with_name("rlsta.py"), preset)
    c.method = "sft"
    c.reward = ""  # no reward: fixed targets
    c.workdir = c.workdir.replace("rlsta", "sft")
    for k in ROLLOUT_KEYS:  # no rollouts: no group size, rollout sampling, GRPO loss or reward weights
        del c.rl[k]
    c.sft = ConfigDict()
    c.sft.val_fraction = 0.1  # problems held out for the validation loss
    if preset == "paper":
        c.rl.lr = 1e-6
        c.rl.batch_size = 32
        c.rl.steps = 100  # about 5 epochs of ~640 rows; set it to 5 * rows / 32 for the data at hand
        c.eval.every = 10  # validation loss (and the kept checkpoint) every N steps
    elif preset == "experiment2":  # rlsta:experiment2's items (filtered), budgets, LoRA, lr and probe
        c.rl.batch_size = 4
        c.rl.steps = 95  # the paper's 5 epochs: the data stage's 84 items give 76 training rows (8 validation)
        c.eval.every = 19  # once per epoch (the paper keeps the best epoch); the last step is evaluated too
        c.checkpoint.every = 19
    else:
        c.filter.enabled = False  # the 135M model is rarely better single-turn than multi-turn on these
        c.filter.k = 4
        c.filter.temperature = 0.7
        c.sft.val_fraction = 0.25
        c.rl.batch_size = 2
        c.rl.steps = 6
        c.rl.lr = 1e-5
        c.eval.every = 2
        c.log.samples_every = 0
    return c

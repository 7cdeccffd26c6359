"""SFT baseline of RLSTA's Table 1: the correct single-turn response appended to the multi-turn history.

Data: RLSTA's histories (configs/rlsta.py's sources and latent-capability filter); for each, the
policy's first correct response to the full single-turn prompt among `filter.k` samples is the
target (jaxrl_mt/rl/supervised.py). The paper: lr 1e-6, batch 32, 5 epochs, the checkpoint with the
lowest validation loss (kept in <workdir>/best and exported). `rl.steps` counts optimizer steps:
5 epochs are 5 * rows / 32 steps (the run logs how many epochs its steps make).
Presets: `paper`, `cpu` (embedded SmolLM2-135M, minutes on 2 cores), `experiment2` / `experiment3` (issues
35's and 56's SFT arms),
`stage0` (experiment 3's stage 0: the embedded model fine-tuned on single-turn worked solutions only;
docs/results/experiment3_plan.md).
Use: python -m jaxrl_mt.train --config configs/sft.py:cpu
"""

import runpy
from pathlib import Path

from ml_collections import ConfigDict

from jaxrl_mt.rl.run_config import ROLLOUT_KEYS
from jaxrl_mt.runtime import load_config_file

# experiment 3 (docs/results/experiment3_plan.md): 5 epochs of the data stage's training rows at batch 4, a multiple
# of 4 (a checkpoint every quarter): 240 filtered items of 128 problems, 214 training rows at seed 0 (216, 219 at 1, 2)
EXP3_STEPS = 268  # 5.01 epochs of 214 rows


def get_config(preset: str = "paper") -> ConfigDict:
    if preset not in ("paper", "cpu", "experiment2", "experiment3", "stage0"):
        raise ValueError(f"unknown preset {preset!r}; expected 'paper', 'cpu', 'experiment2', 'experiment3' or "
                         "'stage0'")
    c = load_config_file(Path(__file__).with_name("rlsta.py"), "paper" if preset == "stage0" else preset)
    c.method = "sft"
    c.reward = ""  # no reward: fixed targets
    c.workdir = c.workdir.replace("rlsta", "sft")
    for k in ROLLOUT_KEYS:  # no rollouts: no group size, rollout sampling, GRPO loss or reward weights
        del c.rl[k]
    c.sft = ConfigDict()
    c.sft.val_fraction = 0.1  # problems held out for the validation loss
    c.sft.targets = "history"  # "history": after RLSTA's histories; "solution": single-turn worked solutions
    if preset == "paper":
        c.rl.lr = 1e-6
        c.rl.batch_size = 32
        c.rl.steps = 100  # about 5 epochs of ~640 rows; set it to 5 * rows / 32 for the data at hand
        c.eval.every = 10  # validation loss (and the kept checkpoint) every N steps
    elif preset == "stage0":
        _stage0(c)
    elif preset == "experiment2":  # rlsta:experiment2's items (filtered), budgets, LoRA, lr and probe
        c.rl.batch_size = 4
        c.rl.steps = 95  # the paper's 5 epochs: the data stage's 84 items give 76 training rows (8 validation)
        c.eval.every = 19  # once per epoch (the paper keeps the best epoch); the last step is evaluated too
        c.checkpoint.every = 19
    elif preset == "experiment3":  # rlsta:experiment3's items, budget, LoRA, lr, probe and checkpoint selection
        c.rl.batch_size = 4
        c.rl.steps = EXP3_STEPS  # the paper's 5 epochs of the data stage's training rows
        c.eval.every = c.eval.probe_every = c.checkpoint.every = c.rl.steps // 4
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


def _stage0(c: ConfigDict) -> None:
    """Experiment 3's stage 0 (docs/results/experiment3_plan.md): single-turn SFT on worked solutions.

    Every training problem once as [system, full prompt] -> its worked solution, never a multi-turn
    conversation; full fine-tuning; the validation loss on 5% of the training problems picks the kept
    checkpoint; the probe answers the validation split (training templates, another seed) greedily,
    FULL and MT-Add (sharded), so the premise is read off the run's own curves.
    """
    shared = runpy.run_path(str(Path(__file__).with_name("rlsta.py")))
    data = shared["EXP3_DATA"]  # python -m experiments.exp3_data (train, validation, heldout, ...)
    c.workdir = "runs/exp3/stage0"
    c.system_prompt = shared["EXP2_SYSTEM"]  # the worked solutions end as it asks: "The answer is N."
    c.sft.targets = "solution"
    c.sft.val_fraction = 0.05
    c.data.add_source = f"tasks:{data}/train.jsonl"
    c.data.refine_source = ""
    c.data.limit = c.data.heldout = c.data.max_turns = 0
    c.filter.enabled = False
    c.rl.batch_size = 16
    c.rl.remat = False  # the rows fit in memory without rematerialisation ('auto' picks 'dots': slower)
    c.rl.steps = 240  # 16 x 240 rows: 2.0 epochs of the 1,900 training rows
    c.rl.lr = 3e-5
    c.rl.schedule = "cosine"
    c.rl.warmup_steps = 10
    c.rl.max_new_tokens = c.eval.max_new_tokens = 64  # a 3-step solution is under 45 tokens
    c.eval.every = 40
    c.eval.probe_source = f"tasks:{data}/validation.jsonl"
    c.eval.probe_limit = 0
    c.eval.probe_kinds = "full,sharded"
    c.eval.probe_every = 120
    c.log.samples_every = 0
    c.checkpoint.every = 40
    c.checkpoint.keep = 1
    c.export = True

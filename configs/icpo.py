"""ICPO: GRPO that rewards asking or hedging on underspecified prompts and correct answers on complete ones.

Presets: `paper` (lr 1e-6, batch 64, G = 8), `cpu` (embedded model, minutes on 2 cores), `experiment`,
`experiment2` and `experiment3` (the comparisons' ICPO arms: RLSTA's problems, budget and probe).
"""

from pathlib import Path

from ml_collections import ConfigDict

from jaxrl_mt.runtime import load_config_file


def get_config(preset: str = "paper") -> ConfigDict:
    c = load_config_file(Path(__file__).with_name("rlsta.py"), preset)
    shared_problems = c.data.add_source
    c.method = "icpo"
    c.reward = "icpo"  # the verifier on complete prompts, a non-answer on underspecified ones
    c.workdir = c.workdir.replace("rlsta", "icpo")
    c.data.add_source = "gsm8k:@"  # problems to make complete / underspecified prompts from
    c.data.refine_source = ""  # unused by ICPO
    c.rl.alpha = 0.0  # no anchor term in ICPO's reward
    c.rl.verifier_mode = "strict"  # verifier for complete prompts
    c.filter.enabled = False  # no histories, no filtering
    c.icpo = ConfigDict()
    c.icpo.underspecified_ratio = 0.5  # fraction of prompts with 1-2 conditions removed
    c.icpo.judge = "rule"  # response-type judge: "rule" or a backend spec ("local", "http:URL#model")
    if preset == "paper":
        c.rl.loss_type = "grpo"  # ICPO's own recipe: not RLSTA's as-run TRL default ("dapo")
        c.rl.lr = 1e-6
        c.rl.batch_size = 64
        c.rl.group_size = 8
    elif preset in ("experiment", "experiment2"):  # ICPO's arm (issues 15, 35): rlsta's problems, budget, probe
        c.workdir = "runs/icpo_exp" if preset == "experiment" else "runs/exp2/icpo"
        c.data.add_source = "family:train:96:1,family:train:32:2"
        c.data.heldout = 0
    elif preset == "experiment3":  # issue 56's ICPO arm: rlsta:experiment3's problems, budget, LoRA and probe
        c.data.add_source = shared_problems
        c.data.heldout = 0
    elif preset == "cpu":
        c.data.add_source = "synthetic:24:0,gsm8k:@"  # two-shard problems the 135M model can solve + GSM8K
        c.data.limit = 16
        c.data.heldout = 4
        c.rl.steps = 6
        c.rl.batch_size = 2
        c.rl.group_size = 4
        c.rl.max_new_tokens = 64
    return c

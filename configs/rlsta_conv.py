"""RL over whole simulated conversations: the policy plays LiC SHARDED conversations, a reward at every turn.

Each step plays G conversations per problem with the policy (the user reveals one shard per turn: fixed
order, or an LLM user simulator), rewards every assistant turn (the verifier on answer attempts, the
single-turn anchor on the shards revealed so far, optional credit for clarifying while underspecified,
the last turn's verifier as the outcome) and trains every reply with GRPO's loss; docs/training.md,
"RL over whole conversations".

Presets: `cpu` (the embedded SmolLM2-135M on synthetic three-shard problems, minutes on 2 cores)
`paper_shapes` (RLSTA's `paper_shapes` recipe and model at the conversation level, for a device) and
`experiment3` (issue 56's arm: rlsta:experiment3's model, problems, steps, batch, G, budget, LoRA, lr, probe and
checkpoint selection; the arms' problems are its held-out-free training set, the probe its selection).
Use: python -m jaxrl_mt.train --config configs/rlsta_conv.py:cpu
"""

from pathlib import Path

from ml_collections import ConfigDict

from jaxrl_mt.runtime import load_config_file


def get_config(preset: str = "cpu") -> ConfigDict:
    if preset not in ("cpu", "paper_shapes", "experiment3"):
        raise ValueError(f"unknown preset {preset!r}; expected 'cpu', 'paper_shapes' or 'experiment3'")
    c = load_config_file(Path(__file__).with_name("rlsta.py"), preset)
    c.method = "rlsta_conv"
    c.reward = "rlsta_conv"  # rewards.conversation: the per-turn reward
    c.workdir = c.workdir.replace("rlsta", "rlsta_conv")
    c.data.refine_source = ""  # unused: the conversations are SHARDED ones of data.add_source's problems
    c.filter.enabled = False  # no histories: the policy plays the whole conversation
    c.rl.loss_type = "dapo"  # token-normalised: a step's turn rows are padded with empty rows
    c.rl.alpha = 0.5  # weight of the turn anchor R_s
    c.rlsta_conv = ConfigDict()
    c.rlsta_conv.credit = "turn"  # "trajectory": the return, every turn | "turn": reward-to-go per turn index
    c.rlsta_conv.gamma = 1.0  # discount of later turns' rewards
    c.rlsta_conv.wrong_penalty = 0.0  # verifier term of a wrong answer attempt (right: +1, none: 0)
    c.rlsta_conv.clarify_weight = 0.0  # credit for a non-answer while shards are unrevealed (ICPO-style)
    c.rlsta_conv.outcome_weight = 0.0  # the last turn's verifier, added on the last turn
    c.rlsta_conv.max_turns = 0  # assistant turns per conversation at most (0: until the shards are exhausted)
    c.rlsta_conv.user = "fixed"  # "fixed" (shards verbatim, in order) | a user-simulator spec (local, http:URL#M)
    c.rlsta_conv.judge = "rule"  # the answer-attempt judge: "rule" | a backend spec
    c.rlsta_conv.probe_runs = 4  # held-out LiC metrics: sampled conversations per problem and scenario
    c.rlsta_conv.probe_temperature = 1.0
    if preset == "cpu":
        c.data.add_source = "synthetic:16:1"  # one-operation problems: 3 shards (question + 2 conditions)
        c.data.limit = 12
        c.data.heldout = 4
        c.rl.steps = 4
        c.rl.batch_size = 2
        c.rl.group_size = 4
        c.rl.max_new_tokens = 48
        c.eval.max_new_tokens = 48
        c.rlsta_conv.probe_runs = 2
        c.checkpoint.every = 2
    return c

"""RLSTA: GRPO on the last turn of multi-turn histories with a single-turn anchor reward.

Presets: `paper` (the published recipe as the official code runs it), `paper_described` (the same recipe as
the paper text describes it; the differences are listed in docs/training.md), `cpu` (embedded SmolLM2-135M,
<= 15 min on 2 cores) and `experiment` (issue 15's held-out experiment, <= 45 min on 2 cores; see
docs/results/experiment_presets.md), `experiment2` (issue 35's comparison: docs/results/experiment2_plan.md);
`no_verifier` / `no_verifier_cpu`: RLSTA without a verifier (the anchor
reward alone) on `paper` / `cpu`; `paper_shapes`: `paper` on one accelerator at Qwen2.5-1.5B's shapes with
random weights (bf16; issue 54's device run: docs/training.md, "The device preset").
Use: python -m jaxrl_mt.train --config configs/rlsta.py:cpu --config.rl.steps=4
"""

from ml_collections import ConfigDict, FieldReference

# Issue 35's comparison: the reply budget and system prompt chosen by the rule fixed before any run
# (docs/results/experiment2_plan.md), `python -m experiments.budget` -> docs/results/exp2/budget/budget.md.
# No candidate got under 10% cut replies at 192 tokens (a tenth of the replies loop to any budget); the rule's
# fallback, the smallest cut share at 128 tokens: S2 (12.5% cut at 128; FULL strict 14.6% at 256).
EXP2_BUDGET = 128
EXP2_SYSTEM = ("You are a helpful assistant. Solve the problem briefly, in at most three short sentences, and end "
               "with: The answer is N.")
EXP2_LORA_LR = 1e-4  # 10x the full fine-tuning lr (1e-5), the usual ratio for LoRA (Schulman et al. 2025)
# Issue 56's comparison (docs/results/experiment3_plan.md): every arm starts from the stage-0 model
EXP3_MODEL = "runs/exp3/stage0/export"  # `python -m experiments.exp3 stage0` writes (or rebuilds) it
EXP3_DATA = "docs/results/exp3/data"  # `python -m experiments.exp3_data`: arms.jsonl, probe.jsonl, ...
EXP3_BUDGET = 64  # the plan's rule on the stage-0 model (exp3/premise/premise.json: no reply reaches 64)


def get_config(preset: str = "paper") -> ConfigDict:
    c = ConfigDict()
    c.method = "rlsta"  # data recipe: "rlsta" | "grpo" (multi-turn histories) | "icpo" (single-turn prompts)
    c.reward = "rlsta"  # reward function by name (jaxrl_mt.rewards.registry): "rlsta" | "grpo" | "icpo"
    c.model = "builtin:smollm2-135m-instruct"  # policy initialisation (model spec)
    c.ref_model = ""  # frozen reference for the anchor reward and KL ("" = same as model)
    c.workdir = "runs/rlsta"  # checkpoints, logs, caches; an existing run resumes
    c.seed = 0  # global seed (data order, sampling, filtering)
    c.param_dtype = "float32"  # parameter dtype ("float32" | "bfloat16")
    c.dtype = "float32"  # compute dtype
    c.system_prompt = ""  # system prompt ("" = the chat template's default)
    c.attention = "auto"  # attention: "auto" | "einsum" | "blockwise" | "pallas" (TPU) | "cudnn" (GPU); docs/scaling.md
    c.mesh_shape = "auto"  # device mesh "data,fsdp,tensor" (e.g. "2,2,2"); "auto": all devices on data
    c.allow_config_changes = ""  # resume although these data/optimizer-structure fields changed ("a.b,c.d"; "*": any)

    c.data = ConfigDict()
    c.data.add_source = "rlsta_add:@"  # MT-Add problems: comma-separated source specs ("" = none)
    c.data.refine_source = "rlsta_refine:@"  # MT-Refine problems: comma-separated source specs ("" = none)
    c.data.limit = 0  # training problems per source (0 = all), plus `heldout`
    c.data.heldout = 8  # problems per source held out for the before/after evaluation
    c.data.shuffle_shards = False  # shuffle MT-Add condition order
    c.data.max_turns = 0  # skip problems with more user turns than this (0 = no limit)

    c.history = ConfigDict()
    c.history.temperature = 0.7  # sampling temperature of the history turns
    c.history.max_new_tokens = 256  # budget per history turn

    c.filter = ConfigDict()
    c.filter.enabled = True  # latent-capability filtering (keep st_acc > mt_acc)
    c.filter.k = 8  # samples per item for single- and multi-turn accuracy
    c.filter.cap_per_problem = 2  # kept histories per problem
    c.filter.temperature = 1.0  # sampling temperature of the filtering samples

    # every method's steps, batch and optimizer, and the rollout methods' keys (group_size, temperature, top_p;
    # mu .. ppo_kl_coef: the GRPO loss; alpha, anchor_prompt, zero_anchor_for_wrong, verifier_weight: the
    # reward), which configs/sft.py and dpo.py delete (rl.run_config.ROLLOUT_KEYS; docs/training.md)
    c.rl = ConfigDict()
    c.rl.steps = 500  # optimizer steps
    c.rl.batch_size = 16  # prompts per step
    c.rl.group_size = 8  # G: completions per prompt
    c.rl.lr = 3e-7  # peak learning rate
    c.rl.schedule = "constant"  # "constant" | "cosine" | "linear"
    c.rl.warmup_steps = 0  # linear warmup steps
    c.rl.weight_decay = 0.0  # AdamW weight decay
    c.rl.max_grad_norm = 1.0  # global-norm clipping (0 = off)
    c.rl.grad_accum = 1  # micro-batches per optimizer step
    c.rl.mu = 1  # inner GRPO iterations per rollout batch
    c.rl.beta = 1e-4  # KL coefficient
    c.rl.kl_estimator = "k3"  # "k1" | "k3"
    c.rl.epsilon_low = 0.2  # clip range below 1
    c.rl.epsilon_high = 0.2  # clip range above 1
    c.rl.loss_type = "grpo"  # "grpo" (seq-mean-token-mean) | "token_mean" | "dr_grpo" | "dapo" (TRL 0.25)
    c.rl.scale_rewards = True  # divide advantages by the group std
    c.rl.temperature = 1.0  # rollout sampling temperature
    c.rl.top_p = 1.0  # rollout nucleus
    c.rl.max_new_tokens = 1024  # rollout budget
    c.rl.alpha = 1.0  # weight of the anchor reward R_s (0 = plain GRPO)
    c.rl.anchor_prompt = "full"  # anchor context: "full" single-turn prompt | "merged" user turns
    c.rl.zero_anchor_for_wrong = False  # zero R_s of wrong answers in groups with a correct one
    c.rl.verifier_mode = "lenient"  # reward verifier: "strict" (LiC) | "lenient" (RLSTA code)
    c.rl.verifier_weight = 1.0  # w in R = w R_v + alpha R_s (0 = RLSTA without a verifier: the anchor alone)
    # token selection of the clipped loss (rl/cov.py): "clip" (PPO's) | "clip_cov" | "kl_cov" (Cui et al. 2025);
    # the Cov settings' defaults are the paper's 7B recipe
    c.rl.loss_variant = "clip"
    c.rl.clip_cov_ratio = 2e-4  # Clip-Cov: fraction of tokens detached, among those with lb < cov < ub
    c.rl.clip_cov_lb = 1.0
    c.rl.clip_cov_ub = 5.0
    c.rl.kl_cov_ratio = 2e-3  # KL-Cov: fraction of tokens (largest cov) given ppo_kl_coef * |logp - old_logp|
    c.rl.ppo_kl_coef = 1.0
    # rematerialise layers in the backward pass: False, True, "dots" (keep the weight matmuls' outputs) or
    # "auto" (the cheapest whose estimated activations fit half the free memory, per prompt bucket)
    c.rl.remat = FieldReference("auto", field_type=object)
    c.rl.max_batch = 64  # rows per sampler call

    c.eval = ConfigDict()
    c.eval.max_new_tokens = 512  # greedy budget of the held-out evaluation
    c.eval.every = 0  # evaluate every N steps (0 = only before and after training)
    c.eval.probe_source = ""  # held-out probe: source spec of problems no training item comes from ("" = off)
    c.eval.probe_limit = 0  # probe: the first N problems of probe_source (0 = all)
    c.eval.probe_kinds = "sharded,mt_refine"  # probe: scenario kinds answered greedily as real conversations
    c.eval.probe_every = 0  # probe every N steps (0 = only before and after training)
    c.eval.select = ""  # kept and exported checkpoint "METRIC:min|max" (held-out or probe/...); "" = the method's

    c.log = ConfigDict()
    c.log.every = 1  # metrics every N steps
    c.log.samples_every = 10  # sample-completion table every N steps
    c.log.n_samples = 4  # rows in the table

    c.chat = ConfigDict()
    c.chat.enable_thinking = None  # Qwen3 templates: True / False (thinking, no-think); None = the template's default

    c.lora = ConfigDict()
    c.lora.rank = 0  # LoRA rank (0 = full fine-tuning); the reference is then the base weights, no copy
    c.lora.alpha = 32.0  # adapter scale alpha / rank
    c.lora.targets = "q|k|v|o|gate|up|down"  # adapted projections (regex over layer keys)
    c.lora.forward = "unmerged"  # the loss's forward: "unmerged" (x W + s x A B) or "merged" (W + s A B first)

    c.checkpoint = ConfigDict()
    c.checkpoint.every = 50  # save every N steps
    c.checkpoint.keep = 3  # checkpoints kept
    c.export = True  # export the final policy to <workdir>/export as an HF folder

    if preset in ("no_verifier", "no_verifier_cpu"):  # RLSTA w/o verifier: the anchor reward R_s alone
        c = get_config("paper" if preset == "no_verifier" else "cpu")
        _no_verifier(c)
        return c
    if preset in ("paper", "paper_described"):
        _paper(c, as_run=preset == "paper")
    elif preset == "paper_shapes":
        _paper(c, as_run=True)
        _paper_shapes(c)
    elif preset == "cpu":
        c.workdir = "runs/rlsta_cpu"
        # two-shard restatement problems (the 135M model solves ~60% lenient at T=1) + RLSTA's own
        c.data.add_source = "synthetic:16:0,rlsta_add:@"
        c.data.limit = 12
        c.data.max_turns = 4
        c.data.heldout = 4
        c.history.max_new_tokens = 32
        c.history.temperature = 0.7
        c.filter.enabled = False
        c.rl.steps = 6
        c.rl.batch_size = 2
        c.rl.group_size = 4
        c.rl.lr = 1e-6
        c.rl.max_new_tokens = 64
        c.rl.max_batch = 16
        c.eval.max_new_tokens = 64
        c.log.samples_every = 3
        c.checkpoint.every = 3
    elif preset == "experiment":
        _experiment(c)
    elif preset == "experiment2":
        _experiment2(c)
    elif preset in ("experiment3", "experiment3_official"):
        _experiment3(c, as_run=preset == "experiment3_official")
    else:
        raise ValueError(f"unknown preset {preset!r}; expected 'paper', 'paper_described', 'paper_shapes', 'cpu', "
                         "'experiment', 'experiment2', 'experiment3', 'experiment3_official', 'no_verifier' or "
                         "'no_verifier_cpu'")
    return c


def _paper(c: ConfigDict, *, as_run: bool) -> None:
    """The published recipe's reward and loss: `paper` as the official code runs it (as_run), else as described.

    The sampling, optimiser and data settings above are shared; the four settings below are where the
    official RLSTA code and the paper text differ (docs/training.md, "The two paper presets").
    """
    if as_run:
        c.rl.alpha = 1.0 / c.rl.group_size  # the code adds exp(mean logp) / num_generations: alpha = 1/G
        c.rl.loss_type = "dapo"  # not set by the code: TRL 0.25's GRPOConfig default
        c.rl.anchor_prompt = "merged"  # the user turns merged (MT-Refine: corrupted conditions and corrections too)
        c.rl.zero_anchor_for_wrong = False  # the code computes the mask but never applies it
    else:
        c.rl.alpha = 1.0  # R = R_v + alpha R_s as written
        c.rl.loss_type = "grpo"  # GRPO's sequence-mean token-mean objective
        c.rl.anchor_prompt = "full"  # the clean full single-turn prompt
        c.rl.zero_anchor_for_wrong = True  # R_s of wrong answers zeroed in groups holding a correct one


def _paper_shapes(c: ConfigDict) -> None:
    """`paper`'s step on one accelerator at a published model's shapes: what issue 54's device check times.

    The recipe is `paper`'s (RLSTA data, G = 8, 1,024 new tokens, 256-token history turns, so that
    prompts reach the published lengths: a random policy's history replies run to their budget),
    in bf16 with the memory planner's remat, on `random:qwen2.5-1.5b` (models.synthetic: random
    weights, the embedded tokenizer; `--config.model=random:tiny` for a CPU smoke run, or any spec).
    What differs serves the timing, not the arithmetic of a step: a random policy answers nothing, so
    the latent-capability filter (it would keep nothing) and the held-out evaluation are off; 16
    problems per source make the histories of a few steps; one group per micro-batch (`grad_accum` =
    16: the loss's normaliser is the step's, so the update is the same) bounds the activations.
    """
    c.workdir = "runs/rlsta_paper_shapes"
    c.model = "random:qwen2.5-1.5b"
    c.param_dtype = c.dtype = "bfloat16"
    c.rl.remat = "auto"
    c.filter.enabled = False
    c.data.limit = 16
    c.data.heldout = 0
    c.rl.steps = 3
    c.rl.grad_accum = c.rl.batch_size  # one prompt's group of G rows per micro-batch
    c.log.samples_every = 1
    c.checkpoint.every = c.rl.steps
    c.checkpoint.keep = 1


def _no_verifier(c: ConfigDict) -> None:
    """RLSTA without a verifier (the paper's Section 6 arm): R = alpha R_s, the reward never reads a verdict.

    `zero_anchor_for_wrong` needs the verifier's verdicts, so it is off (and refused with w = 0).
    The latent-capability filter still reads the gold answers once, when the data are built (the
    paper's filtered data); `--config.filter.enabled=False` trains on unfiltered histories (its
    appendix), with no verdict anywhere. `reward/verifier` is still computed and logged.
    """
    c.workdir = c.workdir.replace("rlsta", "rlsta_no_verifier")
    c.rl.verifier_weight = 0.0
    c.rl.zero_anchor_for_wrong = False  # alpha stays: with group-normalised advantages its scale does not matter


def _experiment(c: ConfigDict) -> None:
    """Issue 15's RLSTA arm: embedded model, <= 45 min wall on 2 CPU cores (docs/results/experiment_presets.md).

    Training problems: one- and two-step addition/subtraction from the `train` template set
    (jaxrl_mt/data/families.py), each as MT-Add and MT-Refine; the held-out probe reads problems of
    the disjoint `heldout` set (build docs/results/heldout.jsonl with
    `python -m experiments.heldout --out docs/results/heldout.jsonl --seed 0`).
    """
    c.workdir = "runs/rlsta_exp"
    # the measured setting (docs/results/calibration.md): 64 tokens per reply, the chat template's default
    # system prompt; neither 128 tokens nor an answer-format system prompt raised greedy FULL accuracy
    c.system_prompt = ""
    c.data.add_source = "family:train:96:1,family:train:32:2"
    c.data.refine_source = "family:train:96:1,family:train:32:2"
    c.data.limit = 0
    c.data.heldout = 0  # the held-out problems are the probe's (other templates), not a split of these
    c.history.max_new_tokens = 64
    c.history.temperature = 0.7
    c.filter.enabled = True
    c.filter.k = 4
    c.filter.cap_per_problem = 2
    # T = 0.5 (calibration.md): at T = 1 the model samples nonsense (FULL 5% per sample, 19% of problems with a
    # correct one of 4), at T = 0.5 19% per sample and 50% of problems; groups and the filter need correct samples
    c.filter.temperature = 0.5
    c.rl.steps = 36
    c.rl.batch_size = 4
    c.rl.group_size = 6
    c.rl.lr = 1e-5
    c.rl.beta = 1e-3
    c.rl.temperature = 0.5
    c.rl.max_new_tokens = 64
    c.rl.verifier_mode = "strict"
    c.rl.max_batch = 64
    c.rl.remat = "auto"  # the committed runs (docs/results/rlsta_cpu/runs) used True: same arithmetic, more time
    c.eval.max_new_tokens = 64  # the held-out probe's budget; = experiments.compare's --max-new-tokens default
    c.eval.probe_source = "tasks:docs/results/heldout.jsonl"
    c.eval.probe_limit = 24
    c.eval.probe_kinds = "sharded,mt_refine"
    c.eval.probe_every = 12
    c.log.samples_every = 6
    c.checkpoint.every = 12
    c.checkpoint.keep = 1
    c.export = False


def _experiment2(c: ConfigDict) -> None:
    """Issue 35's recipe, shared by every training arm (docs/results/experiment2_plan.md).

    `experiment`'s problems, filter, steps and probe, with the budget and system prompt the plan's
    rule chose (`EXP2_BUDGET`, `EXP2_SYSTEM`) at every stage (histories, filter, rollouts, probe),
    and LoRA rank 16, alpha 32 on the seven projections at `EXP2_LORA_LR`. The seed is `seed`
    (`--config.seed=1`); the arms' workdirs are `runs/exp2/<arm>` (`python -m experiments.exp2`).
    """
    _experiment(c)
    c.workdir = "runs/exp2/rlsta"
    c.system_prompt = EXP2_SYSTEM
    c.history.max_new_tokens = c.rl.max_new_tokens = c.eval.max_new_tokens = EXP2_BUDGET
    c.lora.rank, c.lora.alpha = 16, 32.0
    c.rl.lr = EXP2_LORA_LR
    c.export = True  # the adapter (PEFT folder, <workdir>/adapter) is what the comparison evaluates
    # single-turn probe accuracy too (RLSTA's Fig. 7); added after rlsta_s0 and grpo_s0 had trained (the probe
    # does not touch training: experiment2_plan.md, "Changes")
    c.eval.probe_kinds = "full,sharded,mt_refine"


def _experiment3(c: ConfigDict, *, as_run: bool) -> None:
    """Issue 56's recipe, shared by every training arm (docs/results/experiment3_plan.md).

    `experiment2`'s recipe (steps, batch, G, filter, LoRA, lr, system prompt) from the stage-0 model
    (`EXP3_MODEL`) on the arms' problems (`EXP3_DATA/arms.jsonl`, as MT-Add and MT-Refine) at the
    plan's budget (`EXP3_BUDGET`), RLSTA's reward as the paper describes it (`experiment3`) or as the
    official code runs it (`experiment3_official`); the probe answers the validation subset
    (`probe.jsonl`) at every quarter of the run, when a checkpoint is saved, and the kept and exported
    checkpoint is its best multi-turn accuracy (`eval.select`; the held-out set is never read).
    """
    if not EXP3_BUDGET:
        raise ValueError("experiment3: the reply budget is not chosen yet; run `python -m experiments.exp3 premise` "
                         "and set EXP3_BUDGET in configs/rlsta.py from docs/results/exp3/premise/premise.json")
    _experiment2(c)
    _paper(c, as_run=as_run)
    c.workdir = "runs/exp3/rlsta_official" if as_run else "runs/exp3/rlsta"
    c.model = EXP3_MODEL
    c.data.add_source = c.data.refine_source = f"tasks:{EXP3_DATA}/arms.jsonl"
    c.history.max_new_tokens = c.rl.max_new_tokens = c.eval.max_new_tokens = EXP3_BUDGET
    c.eval.probe_source = f"tasks:{EXP3_DATA}/probe.jsonl"
    c.eval.probe_limit = 0
    c.eval.probe_kinds = "sharded,mt_refine"
    c.eval.probe_every = c.checkpoint.every = c.rl.steps // 4
    c.eval.select = "probe/multi_turn_strict:max"


"""LiC evaluation: `python -m jaxrl_mt.evaluate --config configs/eval_lic.py[:PRESET]`.

Presets:
  cpu      the embedded model on a handful of synthetic and LiC-sample math instructions, N=2,
           short replies, all 8 scenarios; a few minutes on 2 CPU cores.
  cpu_all  every offline task (math, code, database, actions), 2-3 instructions each, FULL and
           SHARDED, N=2, short replies: the per-task table on 2 CPU cores.
  lic      paper-like: every offline task, N=10 runs at temperature 1.0, replies up to 1024 tokens.

Tasks: `task` is one task, a comma-separated list, or `all` (= math, code, database, actions);
`datasets.TASK` gives each task's sources (comma-separated source specs), e.g.
`--config.task=code,database --config.datasets.code=humaneval:@:10`. `dataset`, when set,
replaces them (with several tasks each source must name its task: lic:FILE:TASK, humaneval:...).
summary and data2text are graded by an LLM judge only: they need `--config.judge=http:URL#MODEL`
and a LiC file (`--config.datasets.data2text=lic:FILE:data2text`; not shipped).

Any field can be overridden, e.g. `--config.runs=4 --config.scenarios=full,sharded`; a
misspelt field is an error at start-up.
"""

import ml_collections

from jaxrl_mt.data.records import LIC_SCENARIOS


def get_config(preset: str = "cpu") -> ml_collections.ConfigDict:
    """The evaluation config of `preset` ("cpu" or "lic")."""
    if preset not in ("cpu", "cpu_all", "lic"):
        raise ValueError(f"configs/eval_lic.py: unknown preset {preset!r}; valid: cpu, cpu_all, lic")
    c = ml_collections.ConfigDict()
    c.model = (
        "builtin:smollm2-135m-instruct"  # builtin:NAME, HF folder, hub id, workdir:PATH (checkpoint) or http:URL#MODEL
    )
    c.dtype = "float32"  # parameter and compute dtype of the evaluated model (float32 | bfloat16)
    c.task = "math"  # LiC task(s): math | code | database | actions | a comma-separated list | all
    c.datasets = ml_collections.ConfigDict(
        {  # task -> source specs (jaxrl_mt.data.load_source); '@' = shipped
            "math": "synthetic:2:0,lic:@",
            "code": "humaneval:@:2",  # HumanEval, the first N problems
            "database": "lic:@:database",  # LiC Spider sample (test-suite execution accuracy)
            "actions": "lic:@:actions",  # LiC BFCL sample (AST check)
            "data2text": "",  # needs judge=http:... and a LiC file (lic:FILE:data2text)
            "summary": "",  # LiC summary shards carry document ids: not loadable here
        }
    )
    c.dataset = ()  # when set: these sources instead of `datasets` (several tasks: each spec names its task)
    c.limit = 2  # at most this many instructions per source (0: all)
    c.scenarios = LIC_SCENARIOS  # scenario kinds, comma-separated on the command line
    c.shuffle_shards = False  # shuffle the reveal order of condition shards (seeded)
    c.runs = 2  # N: simulated conversations per instruction and scenario
    c.temperature = 1.0  # assistant sampling temperature (0: greedy)
    c.top_p = 1.0  # assistant nucleus sampling mass (1.0: off)
    c.max_new_tokens = 64  # assistant reply budget per turn, in tokens
    c.max_batch = 32  # at most this many conversations per sampler call
    c.mesh_shape = "auto"  # devices: "auto" (all on data when > 1) | "none" (one device) | "data,fsdp,tensor"
    c.max_chunk_cells = 16 * 512 * 576  # memory cap: rows x prompt bucket x (prompt + reply bucket) per chunk
    c.reuse_cache = True  # keep each conversation's KV cache across turns: prefill only the new tokens of a turn
    c.enable_thinking = ml_collections.FieldReference(None, field_type=object)  # Qwen3: True/False; None: default
    c.attention = "auto"  # attention implementation: auto | einsum | blockwise | pallas (TPU) | cudnn (GPU)
    c.abstain = False  # "+ Abstain": append an instruction to withhold the answer (\boxed{abstain}) while incomplete
    c.system_prompt = ""  # assistant system prompt ("": math the template's default, other tasks their own)
    c.protocol = "lic"  # lic: stop at the first correct answer attempt, score the last attempt | final_turn
    c.verifier_mode = "strict"  # answer check: strict (LiC: extracted answer == gold) | lenient (RLSTA)
    c.judge = "rule"  # answer-attempt judge: rule | local | local:MODEL | http:URL#MODEL
    c.judge_max_new_tokens = 32  # reply budget of an LLM judge (two lines: category and extracted answer)
    c.user_simulator = "fixed"  # user side: fixed (verbatim shards in order) | local | local:MODEL | http:URL#MODEL
    c.user_max_new_tokens = 128  # reply budget of an LLM user simulator
    c.user_temperature = 0.0  # sampling temperature of an LLM user simulator
    c.strategy = "plain"  # how the assistant answers: plain (another method, e.g. sedt, registers its own)
    c.http_concurrency = 8  # concurrent requests to an http: model, judge or user simulator
    c.http_timeout = 60.0  # seconds per HTTP request attempt
    c.http_retries = 3  # retries of a request after a connection error, timeout, 429, 5xx or invalid reply
    c.http_backoff = 0.5  # first retry delay in seconds, doubled each retry (a Retry-After header wins)
    c.http_deadline = 1800.0  # seconds one batch of HTTP requests (a turn) may take; then it fails (0: no limit)
    c.api_key_env = "OPENAI_API_KEY"  # environment variable holding the endpoint's API key (only its name is kept)
    c.workdir = "/tmp/jaxrl_mt_eval_cpu"  # transcripts.jsonl, report.json, report.md and plots go here
    c.seed = 0  # seed of the scenarios (shard order, corruption), the sampler and the bootstrap
    c.bootstrap = 1000  # bootstrap replicates of the confidence intervals
    c.plots = True  # write the PNG plots
    if preset == "cpu_all":
        c.task = "all"
        c.datasets.math = "synthetic:1:0,lic:@"
        c.scenarios = ("full", "sharded")
        c.max_new_tokens = 96
        c.bootstrap = 200
        c.workdir = "/tmp/jaxrl_mt_eval_cpu_all"
    if preset == "lic":
        c.task = "all"
        c.datasets.math = "lic:@"
        c.datasets.code = "humaneval:@"
        c.limit = 0
        c.runs = 10
        c.temperature = 1.0
        c.max_new_tokens = 1024
        c.max_batch = 64
        c.workdir = "/tmp/jaxrl_mt_eval_lic"
    return c

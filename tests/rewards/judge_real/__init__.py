"""The embedded model's labelled replies (JSONL files in this folder): their paths, relative to the
repository root (kept here, out of the installed package; see ``jaxrl_mt.rewards.judge_eval``)."""

REAL_DIR = "tests/rewards/judge_real"  # relative to the repository root
TUNE_V2_FILES = (f"{REAL_DIR}/tune.jsonl", f"{REAL_DIR}/heldout.jsonl")  # the tuning set "tune_v2"
HELDOUT2_FILE = f"{REAL_DIR}/heldout2.jsonl"  # blind-labelled, scored once (round 2); tuning data since round 3
ROUND3_TUNING_FILES = (*TUNE_V2_FILES, HELDOUT2_FILE)  # round 3's tuning data (785 replies)
HELDOUT3_FILE = f"{REAL_DIR}/heldout3.jsonl"  # the third blind held-out set, scored once (round 3)
TUNING_FILES = (*ROUND3_TUNING_FILES, HELDOUT3_FILE)  # round 4: every labelled reply is tuning data (1105)
HELDOUT4_FILE = f"{REAL_DIR}/heldout4.jsonl"  # the fourth blind held-out set (round 4), from held-out problems

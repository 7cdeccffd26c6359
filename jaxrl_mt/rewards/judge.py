"""The response-type judge (LiC categories), one import for its three parts.

- ``judge_rules``: the offline rule-based judge (the default) and the category constants;
- ``judge_llm``: an LLM judge behind any ``ChatBackend`` (classification and answer extraction,
  as the LiC harness prompts it);
- ``judge_eval``: per-type precision / recall / F1 on labelled replies and the CLI
  (``python -m jaxrl_mt.rewards.judge --eval FILE.jsonl``).

The labelled replies of the embedded model live in ``tests/rewards/judge_real/``: since round 4
all four files are tuning data (``tests.rewards.judge_real.TUNING_FILES``: ``tune.jsonl``, ``heldout.jsonl``,
``heldout2.jsonl``, ``heldout3.jsonl``; cross-validated by problem, ``judge_eval.fold_of``); the
blind set of round 4 is ``heldout4.jsonl`` (``tests.rewards.judge_real.HELDOUT4_FILE``).
"""

from __future__ import annotations

import sys

from jaxrl_mt.rewards.judge_eval import (
    N_FOLDS,
    TypeScores,
    answer_attempt_by,
    answer_attempt_by_fold,
    evaluate_labelled,
    format_table,
    load_labelled,
    load_labelled_records,
    macro_f1,
    main,
    mean_over_folds,
)
from jaxrl_mt.rewards.judge_llm import (
    JUDGE_PROMPT,
    LLMVerdict,
    classify_llm,
    judge_llm,
    parse_judge_answer,
    parse_judge_reply,
)
from jaxrl_mt.rewards.judge_rules import (
    NON_ANSWER_TYPES,
    RESPONSE_TYPES,
    classify_rule_based,
    clean_reply,
    is_answer_attempt,
)

__all__ = [
    "JUDGE_PROMPT",
    "NON_ANSWER_TYPES",
    "RESPONSE_TYPES",
    "N_FOLDS",
    "LLMVerdict",
    "TypeScores",
    "answer_attempt_by",
    "answer_attempt_by_fold",
    "classify_llm",
    "classify_rule_based",
    "clean_reply",
    "evaluate_labelled",
    "format_table",
    "is_answer_attempt",
    "judge_llm",
    "load_labelled",
    "load_labelled_records",
    "macro_f1",
    "mean_over_folds",
    "parse_judge_answer",
    "parse_judge_reply",
]

if __name__ == "__main__":
    sys.exit(main())

"""Multi-turn task data: records, loaders, segmentation, scenarios, corruption, grain pipelines.

Modules (one job each):
  records    ShardedTask / Scenario dataclasses, DataError, SCENARIO_KINDS
  numbers    the one number regex shared by segmentation, corruption and reports
  segment    rule-based and LLM (LiC protocol) segmenters
  synthetic  synthetic arithmetic word problems with exact, recomputable answers
  families   templated add/subtract problems in disjoint train / held-out template sets
  corrupt    seeded numeric corruption of condition shards (MT-Refine)
  scenarios  user turns for FULL / CONCAT / SHARDED / RECAP / SNOWBALL / MT-Refine / AtR / AiwR /
             UNDERSPECIFIED
  loaders    GSM8K, RLSTA, LiC, synthetic and scenario files; source specs
  pipeline   grain iterators with checkpointable state
  cli        ``python -m jaxrl_mt.data build|inspect``

Nothing here imports model code (grain is imported only by ``pipeline``).
"""

from jaxrl_mt.data.corrupt import corrupt_task
from jaxrl_mt.data.loaders import (
    asset_path,
    gold_from_gsm8k_answer,
    load_gsm8k,
    load_lic,
    load_rlsta_add,
    load_rlsta_refine,
    load_scenarios_jsonl,
    load_source,
    load_tasks_jsonl,
    save_scenarios_jsonl,
    save_tasks_jsonl,
)
from jaxrl_mt.data.records import SCENARIO_KINDS, DataError, Scenario, ShardedTask
from jaxrl_mt.data.scenarios import build_scenario, build_scenarios
from jaxrl_mt.data.segment import LLMSegmenter, segment_rule_based
from jaxrl_mt.data.synthetic import recompute_answer, synthetic_tasks

__all__ = [
    "SCENARIO_KINDS",
    "DataError",
    "LLMSegmenter",
    "Scenario",
    "ShardedTask",
    "asset_path",
    "build_scenario",
    "build_scenarios",
    "corrupt_task",
    "gold_from_gsm8k_answer",
    "load_gsm8k",
    "load_lic",
    "load_rlsta_add",
    "load_rlsta_refine",
    "load_scenarios_jsonl",
    "load_source",
    "load_tasks_jsonl",
    "recompute_answer",
    "save_scenarios_jsonl",
    "save_tasks_jsonl",
    "segment_rule_based",
    "synthetic_tasks",
]

"""Figures for the rule-based segmenter.

    python -m jaxrl_mt.data.report_segmenter --gsm8k train.jsonl --rlsta mt_add_math_train.jsonl

GSM8K: share of problems whose shards keep every number of the question (as a set, and with
every repeat), and the shard-count histogram (the cap is 10).
RLSTA MT-Add: how often our condition shards carry the same set of numbers as RLSTA's
condition shards (theirs were LLM-written and rewrite some numbers, so this is a figure to
report, not a target), with RLSTA's own agreement with the question for reference. Numbers are
read with :mod:`jaxrl_mt.data.numbers` (commas dropped, ``8.00`` = ``8``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Sequence

from jaxrl_mt.data.loaders import load_rlsta_add
from jaxrl_mt.data.numbers import number_list, number_set
from jaxrl_mt.data.segment import segment_rule_based


def gsm8k_figures(path: str, max_shards: int = 10) -> dict:
    """Number preservation and shard counts of the rule-based segmenter on a GSM8K jsonl."""
    n = kept_set = kept_all = 0
    hist: collections.Counter = collections.Counter()
    failures = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            q = json.loads(line)["question"]
            target, conds = segment_rule_based(q, max_shards)
            shards = [target, *conds]
            n += 1
            hist[len(shards)] += 1
            if number_set(q) <= number_set(shards):
                kept_set += 1
            elif len(failures) < 5:
                failures.append(q)
            want, have = collections.Counter(number_list(q)), collections.Counter(number_list("\n".join(shards)))
            kept_all += not (want - have)
    return {
        "problems": n,
        "numbers_kept": kept_set,
        "numbers_kept_frac": kept_set / max(n, 1),
        "numbers_kept_with_repeats": kept_all,
        "max_shards": max(hist) if hist else 0,
        "over_cap": sum(v for k, v in hist.items() if k > max_shards),
        "shard_histogram": dict(sorted(hist.items())),
        "first_failures": failures,
    }


def rlsta_figures(path: str, max_shards: int = 10) -> dict:
    """Agreement of our condition shards' numbers with RLSTA's MT-Add condition shards."""
    tasks = load_rlsta_add(path)  # validates every record
    n = len(tasks)
    same_conds = same_all = theirs_keep = ours_keep = 0
    for t in tasks:
        q = t.full_prompt
        target, conds = segment_rule_based(q, max_shards)
        ours_c, theirs_c = number_set(conds), number_set(t.conditions)
        same_conds += ours_c == theirs_c
        same_all += number_set([target, *conds]) == number_set(t.shards)
        theirs_keep += theirs_c == number_set(q)
        ours_keep += ours_c == number_set(q)
    return {
        "problems": n,
        "same_condition_numbers": same_conds,
        "same_condition_numbers_frac": same_conds / max(n, 1),
        "same_numbers_all_shards": same_all,
        "rlsta_conditions_equal_question": theirs_keep,
        "ours_conditions_equal_question": ours_keep,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gsm8k", help="GSM8K jsonl (e.g. train.jsonl)")
    p.add_argument("--rlsta", help="RLSTA mt_add_math_train.jsonl")
    p.add_argument("--max-shards", type=int, default=10)
    p.add_argument("--json", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    if not args.gsm8k and not args.rlsta:
        p.error("give --gsm8k and/or --rlsta")
    out = {}
    if args.gsm8k:
        g = out["gsm8k"] = gsm8k_figures(args.gsm8k, args.max_shards)
        print(f"GSM8K {args.gsm8k}: {g['problems']} problems")
        print(f"  every number kept (set):       {g['numbers_kept']}/{g['problems']} = "
              f"{100 * g['numbers_kept_frac']:.2f}%")
        print(f"  every number kept (repeats):   {g['numbers_kept_with_repeats']}/{g['problems']}")
        print(f"  shards per problem: max {g['max_shards']}, over {args.max_shards}: {g['over_cap']}")
        print("  histogram: " + ", ".join(f"{k}:{v}" for k, v in g["shard_histogram"].items()))
    if args.rlsta:
        r = out["rlsta"] = rlsta_figures(args.rlsta, args.max_shards)
        n = r["problems"]
        print(f"RLSTA MT-Add {args.rlsta}: {n} problems")
        print(f"  our condition numbers == RLSTA condition numbers: {r['same_condition_numbers']}/{n} = "
              f"{100 * r['same_condition_numbers_frac']:.1f}%")
        print(f"  same, all shards (target included):                {r['same_numbers_all_shards']}/{n}")
        print(f"  RLSTA condition numbers == question numbers:       {r['rlsta_conditions_equal_question']}/{n}")
        print(f"  our condition numbers == question numbers:         {r['ours_conditions_equal_question']}/{n}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Command line: build scenario files and inspect them.

    python -m jaxrl_mt.data build --source gsm8k:FILE --scenario mt_add --out F.jsonl
    python -m jaxrl_mt.data inspect F.jsonl
    python -m jaxrl_mt.data inspect lic:FILE.json[:task] [--scenario sharded]   # any source spec

Sources: ``gsm8k:FILE``, ``rlsta_add:FILE``, ``rlsta_refine:FILE``, ``lic:FILE[:task]``,
``synthetic:N[:steps]``, ``hf:ID`` (online), ``tasks:FILE``; ``@`` as FILE is the shipped sample.
No model code is imported: ``inspect`` prints the user turns as plain text. It reads a scenario
JSONL file (written by ``build``) or, given a source spec, builds that source's scenarios on the fly.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxrl_mt.data.loaders import SOURCE_KINDS, load_scenarios_jsonl, load_source, save_scenarios_jsonl
from jaxrl_mt.data.records import SCENARIO_KINDS, DataError, Scenario, canonical_kind
from jaxrl_mt.data.scenarios import build_scenario


def render(scenario: Scenario) -> str:
    """Plain-text view of one scenario: header, the user turns, the anchor and the answer."""
    lines = [f"task {scenario.task_id}  kind={scenario.kind}  turns={len(scenario.turns)}  answer={scenario.answer}"]
    if scenario.removed:
        lines.append(f"removed conditions: {list(scenario.removed)}")
    for i, t in enumerate(scenario.turns, 1):
        body = t.replace("\n", "\n          ")
        lines.append(f"  user {i:>2}: {body}")
    lines.append(f"  anchor  : {scenario.anchor_prompt}")
    return "\n".join(lines)


def histogram(counts: dict[int, int], width: int = 40) -> str:
    """Text histogram, one row per key in increasing order."""
    if not counts:
        return "  (empty)"
    top = max(counts.values())
    return "\n".join(
        f"  {k:>3} | {'#' * max(1, round(width * v / top)):<{width}} {v}" for k, v in sorted(counts.items())
    )


def cmd_build(args: argparse.Namespace) -> int:
    kind = canonical_kind(args.scenario)
    segmenter = None
    if args.segmenter != "rule":
        from jaxrl_mt.data.segment import LLMSegmenter  # noqa: PLC0415

        segmenter = LLMSegmenter(args.segmenter)
    tasks = load_source(args.source, segmenter=segmenter)
    if args.limit is not None:
        tasks = tasks[: args.limit]
    scenarios, skipped = [], collections.Counter()
    for t in tasks:
        try:
            scenarios.append(
                build_scenario(
                    t, kind, seed=args.seed, shuffle=args.shuffle, n_shards=args.corrupt_shards, n_remove=args.n_remove
                )
            )
        except DataError as e:
            skipped[str(e).split(": ", 1)[-1][:80]] += 1
    save_scenarios_jsonl(args.out, scenarios)
    print(f"wrote {len(scenarios)} {kind} scenarios from {len(tasks)} tasks to {args.out}")
    for reason, n in skipped.items():
        print(f"skipped {n} task(s): {reason}", file=sys.stderr)
    return 0


EXPECTED = ("a scenario JSONL file (written by `build`) or a source spec: lic:FILE[:task], gsm8k:FILE, "
            "rlsta_add:FILE, rlsta_refine:FILE, tasks:FILE, humaneval:FILE, synthetic:N[:steps], hf:ID")


def scenarios_to_inspect(arg: str, kind: str) -> tuple[list[Scenario], str]:
    """The scenarios of a scenario JSONL file, or those built (as ``kind``) from a source spec.

    Raises:
      DataError: the file or source cannot be read; for a file, saying what ``inspect`` expects.
    """
    prefix, sep, _ = arg.partition(":")
    if sep and prefix in SOURCE_KINDS and not Path(arg).is_file():
        kind = canonical_kind(kind)
        tasks = load_source(arg)
        scenarios = []
        for t in tasks:
            try:
                scenarios.append(build_scenario(t, kind, seed=0))
            except DataError:
                continue  # e.g. no number to correct: the count below says how many
        return scenarios, f"{arg} ({len(tasks)} tasks as {kind})"
    try:
        return load_scenarios_jsonl(arg), arg
    except DataError as e:
        head = Path(arg).read_bytes()[:64].lstrip() if Path(arg).is_file() else b""
        hint = (f"it is a JSON document, not scenario JSONL: for a LiC file, inspect lic:{arg}[:task]"
                if head.startswith(b"[") else f"inspect expects {EXPECTED}")
        raise DataError(f"{e}; {hint}") from None


def cmd_inspect(args: argparse.Namespace) -> int:
    scenarios, name = scenarios_to_inspect(args.file, args.scenario)
    print(f"{name}: {len(scenarios)} scenarios")
    kinds = collections.Counter(s.kind for s in scenarios)
    print("kinds: " + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
    shards = collections.Counter(int(s.meta.get("n_shards", len(s.turns))) for s in scenarios)
    print("shards per task (target + conditions):")
    print(histogram(shards))
    turns = collections.Counter(len(s.turns) for s in scenarios)
    print("user turns per conversation:")
    print(histogram(turns))
    if scenarios:
        i = min(max(args.example, 0), len(scenarios) - 1)
        print(f"example {i}:")
        print(render(scenarios[i]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxrl_mt.data",
                                description="Build and inspect multi-turn scenario files.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a scenario jsonl from a task source")
    b.add_argument("--source", required=True,
                   help="gsm8k:FILE | rlsta_add:FILE | rlsta_refine:FILE | lic:FILE[:task] | synthetic:N[:steps] "
                        "| hf:ID")
    b.add_argument("--scenario", required=True, help=f"one of {', '.join(SCENARIO_KINDS)} (mt_add = sharded)")
    b.add_argument("--out", required=True, help="output jsonl")
    b.add_argument("--segmenter", default="rule",
                   help="'rule' or an LLM backend spec ('http:URL#MODEL', 'local') for gsm8k/hf sources")
    b.add_argument("--seed", type=int, default=0, help="seed for order, corruption and removal")
    b.add_argument("--shuffle", action="store_true", help="shuffle the order of condition shards")
    b.add_argument("--limit", type=int, default=None, help="use only the first N tasks")
    b.add_argument("--corrupt-shards", type=int, default=None,
                   help="shards to corrupt when a task has none (default: all with numbers)")
    b.add_argument("--n-remove", type=int, default=None,
                   help="underspecified: conditions to remove (1 or 2; default drawn)")
    b.set_defaults(fn=cmd_build)
    i = sub.add_parser("inspect", help="counts, shard-count histogram and one rendered example")
    i.add_argument("file", help="a scenario jsonl, or a source spec (lic:FILE[:task], gsm8k:FILE, synthetic:N, ...)")
    i.add_argument("--scenario", default="sharded",
                   help=f"for a source spec: the scenario kind to build, one of {', '.join(SCENARIO_KINDS)}")
    i.add_argument("--example", type=int, default=0, help="index of the example to render")
    i.set_defaults(fn=cmd_inspect)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

"""Command-line generation: `python -m jaxrl_mt.generate --prompt "What is 2+2?"`.

Prompts come from `--prompt TEXT` or a JSONL file whose lines are `{"prompt": str}` or
`{"messages": [{"role": ..., "content": ...}, ...]}`; each is rendered with the model's chat
template and all of them are generated in batches by one `Sampler`. Completions are printed as
one text block per prompt, or with `--json` as one JSON line per prompt (text, token ids, their
log-probabilities, finish reason). Bad input is reported as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

from jaxrl_mt.chat import ROLES, ChatError, encode_prompt

EXIT_USAGE = 2


class UsageError(ValueError):
    """Bad command-line input; the message names the file, line and field or the bad value."""


@dataclasses.dataclass(frozen=True)
class PromptSpec:
    """One prompt to complete, with where it came from."""

    messages: tuple[dict[str, str], ...]  # the conversation to continue
    source: str  # "--prompt" or "FILE:LINE"


def _check_messages(messages: Any, where: str) -> tuple[dict[str, str], ...]:
    """Validates a `messages` value; errors name `where` and the field."""
    if not isinstance(messages, list):
        raise UsageError(f"{where}:messages: expected a list of messages, got {type(messages).__name__}")
    if not messages:
        raise UsageError(f"{where}:messages: empty prompt (no messages)")
    out = []
    for i, m in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(m, dict):
            raise UsageError(f"{where}:{field}: expected an object with 'role' and 'content', "
                             f"got {type(m).__name__}")
        for key in m:
            if key not in ("role", "content"):
                raise UsageError(f"{where}:{field}.{key}: unknown field")
        if "role" not in m:
            raise UsageError(f"{where}:{field}.role: missing")
        if m["role"] not in ROLES:
            raise UsageError(f"{where}:{field}.role: unknown role {m['role']!r}; expected one of {', '.join(ROLES)}")
        if "content" not in m:
            raise UsageError(f"{where}:{field}.content: missing")
        if not isinstance(m["content"], str):
            raise UsageError(f"{where}:{field}.content: expected a string, got {type(m['content']).__name__}")
        out.append({"role": m["role"], "content": m["content"]})
    if all(m["role"] == "system" for m in out):
        raise UsageError(f"{where}:messages: no user or assistant message")
    if not any(m["content"].strip() for m in out if m["role"] != "system"):
        raise UsageError(f"{where}:messages: empty prompt (every user/assistant content is blank)")
    return tuple(out)


def parse_prompt_line(line: str, where: str) -> PromptSpec:
    """Parses one JSONL line (`{"prompt": str}` or `{"messages": [...]}`) into a PromptSpec."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise UsageError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in obj:
        if key not in ("prompt", "messages"):
            raise UsageError(f"{where}:{key}: unknown field; expected 'prompt' or 'messages'")
    if ("prompt" in obj) == ("messages" in obj):
        raise UsageError(f"{where}: expected exactly one of the fields 'prompt' and 'messages'")
    if "prompt" in obj:
        text = obj["prompt"]
        if not isinstance(text, str):
            raise UsageError(f"{where}:prompt: expected a string, got {type(text).__name__}")
        if not text.strip():
            raise UsageError(f"{where}:prompt: empty prompt")
        return PromptSpec(({"role": "user", "content": text},), where)
    return PromptSpec(_check_messages(obj["messages"], where), where)


def read_prompts_file(path: str | Path) -> list[PromptSpec]:
    """Reads a JSONL prompts file (blank lines skipped); raises UsageError naming file:line:field."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise UsageError(f"{p}: cannot read prompts file ({type(e).__name__}: {e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, col = data.count(b"\n", 0, e.start) + 1, e.start - data.rfind(b"\n", 0, e.start)
        raise UsageError(f"{p}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at column {col}); "
                         "save the prompts file as UTF-8") from None
    specs = [parse_prompt_line(line, f"{p}:{n}") for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not specs:
        raise UsageError(f"{p}: no prompts")
    return specs


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `python -m jaxrl_mt.generate`."""
    from jaxrl_mt.models.registry import DEFAULT_MODEL

    ap = _Parser(prog="python -m jaxrl_mt.generate", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"model spec (default {DEFAULT_MODEL})")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one user message")
    src.add_argument("--prompts-file", help='JSONL: {"prompt": str} or {"messages": [...]} per line')
    ap.add_argument("--system", default=None, help="system message (unless a conversation has one)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0: off)")
    ap.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per generate call (default 8)")
    ap.add_argument("--json", action="store_true", help="print one JSON line per prompt")
    return ap


def _check_args(args: argparse.Namespace) -> None:
    if args.max_new_tokens <= 0:
        raise UsageError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise UsageError(f"--temperature must be >= 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.top_k < 0:
        raise UsageError(f"--top-k must be >= 0, got {args.top_k}")
    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be > 0, got {args.batch_size}")
    if args.prompt is not None and not args.prompt.strip():
        raise UsageError("--prompt: empty prompt")


def encode_prompts(tokenizer: Any, specs: Sequence[PromptSpec], *, system: str | None,
                   max_new_tokens: int, context: int) -> list[list[int]]:
    """Token ids of each prompt; raises UsageError when one does not fit the model context."""
    ids = []
    for s in specs:
        try:
            row = encode_prompt(tokenizer, s.messages, system=system)
        except ChatError as e:
            raise UsageError(f"{s.source}: {e}") from None
        if len(row) + max_new_tokens > context:
            raise UsageError(f"{s.source}: prompt of {len(row)} tokens + {max_new_tokens} new tokens "
                             f"exceeds the model context ({context} tokens)")
        ids.append(row)
    return ids


def _write(result: Any, specs: Sequence[PromptSpec], as_json: bool, out: TextIO) -> None:
    for i, s in enumerate(specs):
        if as_json:
            rec = {"index": i, "source": s.source, "text": result.texts[i], "tokens": result.tokens[i],
                   "logprobs": [float(x) for x in result.logprobs[i]],
                   "finish_reason": result.finish_reasons[i]}
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
        else:
            out.write(f"--- [{i}] {s.source} ({result.finish_reasons[i]}, {len(result.tokens[i])} tokens)\n")
            out.write(result.texts[i] + "\n\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit status (0 ok, 2 bad input)."""
    try:
        args = build_parser().parse_args(argv)
        _check_args(args)
        specs = (read_prompts_file(args.prompts_file) if args.prompts_file is not None
                 else [PromptSpec(({"role": "user", "content": args.prompt},), "--prompt")])
        from jaxrl_mt.models.config import ModelError
        from jaxrl_mt.models.registry import load_model
        from jaxrl_mt.sampling import Sampler, SamplingConfig

        try:
            model = load_model(args.model)
        except ModelError as e:
            raise UsageError(f"--model: {e}") from None
        if model.tokenizer is None:
            raise UsageError(f"--model {args.model}: no tokenizer")
        ids = encode_prompts(model.tokenizer, specs, system=args.system, max_new_tokens=args.max_new_tokens,
                             context=model.cfg.max_position_embeddings)
        sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  top_k=args.top_k, top_p=args.top_p)
        sampler = Sampler.from_model(model, max_batch=args.batch_size)
        t0 = time.perf_counter()
        result = sampler.generate_ids(ids, sampling, seed=args.seed)
        dt = time.perf_counter() - t0
    except UsageError as e:
        print(f"error: {' '.join(str(e).splitlines())}", file=sys.stderr)
        return EXIT_USAGE
    _write(result, specs, args.json, sys.stdout)
    n = int(result.lengths.sum())
    print(f"{len(specs)} prompts, {n} new tokens in {dt:.2f} s ({n / dt:.1f} tok/s, compile included)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

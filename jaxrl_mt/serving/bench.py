"""Load test of the server: throughput one request at a time against many concurrent clients.

    python -m jaxrl_mt.serving.bench --model builtin:smollm2-135m-instruct --clients 64

Starts the server in process on 127.0.0.1 and drives it with the official ``openai`` client
(installed with the ``test`` extra), greedy, ``--max-tokens`` per reply:

1. one at a time: ``--sequential`` requests, each sent when the previous one is answered;
2. concurrent: ``--clients`` threads send one request each at the same moment (all must be
   answered), once per batching window in ``--windows-ms``;
3. the latency cost of the window: a lone request's latency under each window, and the time it
   waited in the server's queue before its sampler call started (the window's direct cost).

Phases 1 and 2 are run once untimed first (phase 2 under the first window), so compilation is
not measured, except where a window splits the clients into batches of a new size: each phase
lists the shapes it had to compile (``new_shapes_compiled``), the batcher's busy spells
(``sampler_calls``: run_turns calls) and decode segments. Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["run_bench"]

QUESTIONS = ("What is {a} + {b}?", "Name {a} colours.", "Write a sentence about the number {b}.",
             "Tom has {a} apples and buys {b} more. How many does he have?")


def prompts(n: int) -> list[list[dict[str, str]]]:
    """n different short chats."""
    return [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)].format(a=i + 2, b=3 * i + 1)}]
            for i in range(n)]


def _ask(client: Any, model: str, chat: list[dict[str, str]], max_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = client.chat.completions.create(model=model, messages=chat, temperature=0, max_tokens=max_tokens)
    if not r.choices or r.choices[0].message.content is None:
        raise RuntimeError(f"empty reply: {r}")
    return time.perf_counter() - t0, r.usage.completion_tokens


def one_at_a_time(client: Any, model: str, chats: Sequence[list[dict[str, str]]], max_tokens: int) -> dict:
    """Requests in sequence: wall time, requests/s, tokens/s, latencies."""
    t0 = time.perf_counter()
    results = [_ask(client, model, c, max_tokens) for c in chats]
    wall = time.perf_counter() - t0
    lat = [r[0] for r in results]
    tokens = sum(r[1] for r in results)
    return {"requests": len(chats), "answered": len(results), "wall_s": wall, "req_per_s": len(chats) / wall,
            "tok_per_s": tokens / wall, "tokens": tokens, "latency_mean_s": statistics.mean(lat),
            "latency_max_s": max(lat)}


def concurrent(client: Any, model: str, chats: Sequence[list[dict[str, str]]], max_tokens: int) -> dict:
    """One thread per chat, released together: wall time, throughput, latencies, failures."""
    results: list[tuple[float, int] | None] = [None] * len(chats)
    errors: list[str] = []
    barrier = threading.Barrier(len(chats) + 1)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = _ask(client, model, chats[i], max_tokens)
        except Exception as e:  # noqa: BLE001 (counted and reported)
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(chats))]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if r is not None]
    tokens = sum(r[1] for r in ok)
    lat = [r[0] for r in ok] or [float("nan")]
    return {"requests": len(chats), "answered": len(ok), "errors": errors[:3], "wall_s": wall,
            "req_per_s": len(ok) / wall, "tok_per_s": tokens / wall, "tokens": tokens,
            "latency_mean_s": statistics.mean(lat), "latency_max_s": max(lat)}


def _settle(batcher: Any) -> None:
    """Returns once the batcher's last spell is over (a spell's counters are final then)."""
    while not batcher.idle:
        time.sleep(0.001)


def run_bench(model: Any, *, clients: int = 64, sequential: int = 16, max_tokens: int = 32,
              windows_ms: Sequence[float] = (2000.0, 5.0, 0.0), lone: int = 8, max_batch: int = 64,
              slice_tokens: int = 16) -> dict:
    """Runs the three phases against a server on ``model`` (a loaded registry Model; ``slice_tokens``:
    the batcher's decode steps per segment, between which requests are admitted; 0: the engine's)."""
    import openai

    from jaxrl_mt.serving.server import ServerThread, build_service

    service = build_service(model, names=["bench"], max_batch=max_batch, window_ms=windows_ms[0],
                            slice_tokens=slice_tokens)
    out: dict[str, Any] = {"model": model.spec, "clients": clients, "max_tokens": max_tokens, "max_batch": max_batch,
                           "slice_tokens": slice_tokens}
    with ServerThread(service) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=1800)
        chats = prompts(clients)
        one_at_a_time(client, "bench", chats[:2], max_tokens)  # warm-up (compiles batch 1)
        out["one_at_a_time"] = one_at_a_time(client, "bench", chats[:sequential], max_tokens)
        out["concurrent"] = {}
        service.batcher.window_s = windows_ms[0] / 1000
        concurrent(client, "bench", chats, max_tokens)  # warm-up: compiles the batch shapes
        for w in windows_ms:
            service.batcher.window_s = w / 1000
            _settle(service.batcher)  # the previous run's spell is over: its counters are final
            before, wait = dict(service.batcher.stats), service.batcher.wait_s
            shapes = set(service.sampler.compiled_shapes)
            res = concurrent(client, "bench", chats, max_tokens)
            _settle(service.batcher)
            after = service.batcher.stats
            res["new_shapes_compiled"] = sorted(service.sampler.compiled_shapes - shapes)  # inside the timing
            res["sampler_calls"] = after["spells"] - before.get("spells", 0)
            res["segments"] = after["segments"] - before.get("segments", 0)
            res["queue_wait_mean_ms"] = 1000 * (service.batcher.wait_s - wait) / (after["jobs"] - before["jobs"])
            out["concurrent"][f"window_{w:g}ms"] = res
        out["lone"] = {}
        for w in windows_ms:
            service.batcher.window_s = w / 1000
            b = service.batcher
            jobs, wait = b.stats["jobs"], b.wait_s
            lat = [_ask(client, "bench", chats[0], max_tokens)[0] for _ in range(lone)]
            out["lone"][f"window_{w:g}ms"] = {"latency_median_s": statistics.median(lat),
                                              "queue_wait_mean_ms": 1000 * (b.wait_s - wait) / (b.stats["jobs"] - jobs)}
    best = max(out["concurrent"].values(), key=lambda r: r["tok_per_s"])
    out["speedup_tok_per_s"] = best["tok_per_s"] / out["one_at_a_time"]["tok_per_s"]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m jaxrl_mt.serving.bench", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--sequential", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--windows-ms", default="2000,5,0", help="comma-separated batching windows to compare (the "
                                                           "first also serves the warm-up)")
    p.add_argument("--lone", type=int, default=8, help="lone requests per window for the latency cost")
    p.add_argument("--slice-tokens", type=int, default=16, help="the batcher's decode steps per segment "
                                                               "(0: the engine's)")
    args = p.parse_args(argv)
    from jaxrl_mt.models.registry import load_model

    result = run_bench(load_model(args.model), clients=args.clients, sequential=args.sequential,
                       max_tokens=args.max_tokens, windows_ms=[float(w) for w in args.windows_ms.split(",")],
                       lone=args.lone, slice_tokens=args.slice_tokens)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

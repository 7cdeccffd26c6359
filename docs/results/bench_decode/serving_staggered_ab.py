"""Server throughput when requests arrive spread out with mixed budgets (issue 51: refill between requests).

    PYTHONPATH=<tree> python docs/results/bench_decode/serving_staggered_ab.py --out OUT.json

Runs the server of the tree on PYTHONPATH (in process, 127.0.0.1) on the embedded model and sends
``--clients`` greedy requests, client i at i * ``--spread-s`` / clients seconds, its ``max_tokens``
cycling through ``--budgets``: once untimed (compiles), then ``--rounds`` timed. Each round: wall
from the first send to the last answer, requests/s, latency mean / p90 / max. Uses only what every
tree since issue 53 has (``serving.server.build_service``, ``ServerThread``, ``serving.bench``'s
chats), so an old tree runs the same load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time


def staggered(client, chats, budgets, spread_s):
    """Sends chat i at i * spread_s / n seconds (one thread each); returns the round's figures."""
    n = len(chats)
    lat, tokens, errors = [None] * n, [0] * n, []
    t0 = time.perf_counter()

    def worker(i):
        time.sleep(max(0.0, t0 + i * spread_s / n - time.perf_counter()))
        s = time.perf_counter()
        try:
            r = client.chat.completions.create(model="bench", messages=chats[i], temperature=0,
                                               max_tokens=budgets[i % len(budgets)])
            lat[i], tokens[i] = time.perf_counter() - s, r.usage.completion_tokens
        except Exception as e:  # noqa: BLE001 (counted)
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = sorted(x for x in lat if x is not None)
    return {"wall_s": wall, "answered": len(ok), "errors": errors[:3], "req_per_s": len(ok) / wall,
            "tok_per_s": sum(tokens) / wall, "latency_mean_s": statistics.mean(ok),
            "latency_p90_s": ok[int(0.9 * (len(ok) - 1))], "latency_max_s": ok[-1]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--spread-s", type=float, default=8.0)
    p.add_argument("--budgets", default="8,64")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    import openai

    import jaxrl_mt
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.serving.bench import prompts
    from jaxrl_mt.serving.server import ServerThread, build_service

    budgets = [int(b) for b in args.budgets.split(",")]
    service = build_service(load_model("builtin:smollm2-135m-instruct"), names=["bench"], max_batch=64)
    out = {"tree": jaxrl_mt.__file__, "clients": args.clients, "spread_s": args.spread_s, "budgets": budgets}
    with ServerThread(service) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=1800)
        chats = prompts(args.clients)
        out["warmup"] = staggered(client, chats, budgets, args.spread_s)
        out["rounds"] = [staggered(client, chats, budgets, args.spread_s) for _ in range(args.rounds)]
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out["rounds"]))


if __name__ == "__main__":
    main()

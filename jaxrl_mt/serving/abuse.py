"""The abuse probe of issue 53: good clients served while big bodies, slow bodies and a long prompt arrive.

    python -m jaxrl_mt.serving.abuse --model builtin:smollm2-135m-instruct
    python -m jaxrl_mt.serving.abuse --tiny   # a random 2-layer model with the embedded tokenizer

Starts the server in process on 127.0.0.1 (``--max-batch`` rows, default settings otherwise),
compiles what the load will need (a short reply, a batch of the good clients, the long prompt
alone), then at once sends: ``--big`` bodies of 100,000 one-character messages (3.4 MB each, under
the 4 MiB cap), ``--slow`` bodies trickled over ``--slow-s`` seconds, one prompt of ``--long``
tokens with ``max_tokens`` 64, and ``--clients`` good clients (one short request each, greedy,
``--max-tokens``); ``--big 0 --slow 0 --long 0`` is the baseline of good clients alone.
Meanwhile a small request (one token) is sent every ``--every-s`` seconds, one
after another, and its latency recorded: the number the issue asks for. Prints a JSON summary
(latencies, statuses, the batcher's counters). Uses only ``ServerThread`` and ``build_service``
with their old arguments, so the same file measures an older checkout.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

__all__ = ["run_abuse", "tiny_model"]

NAME = "bench"


def _post(url: str, payload: bytes, timeout: float = 1800) -> tuple[int, float, dict]:
    """(status, seconds, body) of one chat-completions request (urllib: Connection: close)."""
    req = urllib.request.Request(url + "/chat/completions", data=payload, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, time.perf_counter() - t0, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, time.perf_counter() - t0, json.loads(e.read() or b"{}")


def _body(messages: list[dict[str, str]], max_tokens: int) -> bytes:
    return json.dumps({"model": NAME, "messages": messages, "temperature": 0, "max_tokens": max_tokens}).encode()


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _slow(port: int, payload: bytes, seconds: float) -> tuple[int, float]:
    """Sends ``payload`` in 20 pieces over ``seconds``; (status, seconds) of the reply (0: none)."""
    t0 = time.perf_counter()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload))
    with socket.create_connection(("127.0.0.1", port), timeout=1800) as sock:
        sock.sendall(head)
        step = -(-len(payload) // 20)
        for i in range(0, len(payload), step):
            sock.sendall(payload[i:i + step])
            time.sleep(seconds / 20)
        reply = sock.recv(64)
    status = int(reply.split(b" ")[1]) if reply.startswith(b"HTTP/1.1 ") else 0
    return status, time.perf_counter() - t0


def _long_text(tokenizer: Any, tokens: int) -> str:
    """A user message of 97% to 100% of ``tokens`` tokens."""
    words, text = tokens // 3, ""
    for _ in range(30):
        text = " ".join(f"w{i % 97}" for i in range(words))
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if 0.97 * tokens <= n <= tokens:
            break
        words = max(1, int(words * tokens / n * (0.985 if n > tokens else 1.0)))
    return text


def _summary(times: Sequence[float]) -> dict[str, float]:
    return {"n": len(times), "median_s": statistics.median(times), "max_s": max(times)} if times else {"n": 0}


def run_abuse(model: Any, *, clients: int = 64, max_tokens: int = 16, big: int = 4, slow: int = 4,
              slow_s: float = 3.0, long: int = 3900, every_s: float = 0.5, max_batch: int = 64, rounds: int = 2
              ) -> dict:
    """Runs the probe against a server on ``model`` (a loaded registry Model); see the module doc. The
    load is sent ``rounds`` times (a later round runs on the shapes the first one compiled)."""
    from jaxrl_mt.serving.server import ServerThread, build_service

    service = build_service(model, names=[NAME], max_batch=max_batch)
    long_body = _body(_user(_long_text(model.tokenizer, long)), 64) if long > 0 else b""
    big_body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "w"}] * 100_000,
                           "max_tokens": 1}).encode()
    goods = [_body(_user(f"What is {i + 2} + {3 * i + 1}?"), max_tokens) for i in range(clients)]
    out: dict[str, Any] = {"model": model.spec, "clients": clients, "big_body_bytes": len(big_body),
                           "long_prompt_bytes": len(long_body)}
    with ServerThread(service) as server:
        url = server.url
        t0 = time.perf_counter()
        _post(url, _body(_user("hi"), 1))
        threads = [threading.Thread(target=_post, args=(url, g)) for g in goods]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        status, secs, reply = _post(url, long_body) if long_body else (0, 0.0, {})
        out["warmup_s"], out["long_alone"] = time.perf_counter() - t0, {"status": status, "s": secs,
                                                                         "usage": reply.get("usage")}
        out["rounds"] = [_load(server, service, big_body, long_body, goods, big=big, slow=slow, slow_s=slow_s,
                               every_s=every_s) for _ in range(rounds)]
    out["max_rows_held"] = service.batcher.max_rows_seen
    return out


def _load(server: Any, service: Any, big_body: bytes, long_body: bytes, goods: list[bytes], *, big: int,
          slow: int, slow_s: float, every_s: float) -> dict:
    """One round of the load: latencies and statuses of each kind of client, the batcher's counters."""
    url = server.url
    out: dict[str, Any] = {}
    before = dict(service.batcher.stats)
    res: dict[str, list] = {"big": [], "slow": [], "long": [], "good": [], "small": []}
    done = threading.Event()
    jobs = ([threading.Thread(target=lambda: res["big"].append(_post(url, big_body)[:2])) for _ in range(big)]
            + [threading.Thread(target=lambda: res["slow"].append(_slow(server.port, goods[0], slow_s)))
               for _ in range(slow)]
            + [threading.Thread(target=lambda: res["long"].append(_post(url, long_body)[:2])) for _ in long_body[:1]]
            + [threading.Thread(target=lambda g=g: res["good"].append(_post(url, g)[:2])) for g in goods])
    t0 = time.perf_counter()
    for t in jobs:
        t.start()

    def probe() -> None:
        while not done.is_set():
            time.sleep(every_s)
            res["small"].append(_post(url, _body(_user("hi"), 1))[:2])

    prober = threading.Thread(target=probe)
    prober.start()
    for t in jobs:
        t.join()
    out["load_wall_s"] = time.perf_counter() - t0
    done.set()
    prober.join()
    after = service.batcher.stats
    for kind, got in res.items():
        out[kind] = {"statuses": sorted({s for s, _ in got}), **_summary([s for _, s in got])}
    out["small"]["latencies_s"] = [round(s, 3) for _, s in res["small"]]
    out["batcher"] = {k: after[k] - before.get(k, 0) for k in sorted(after)}
    return out


def tiny_model(folder: str) -> Any:
    """A random 2-layer Llama (width 32, context 4096) with the embedded model's tokenizer, saved
    under ``folder`` and loaded (the tests' tiny model)."""
    import jax

    from jaxrl_mt.models.config import ModelConfig
    from jaxrl_mt.models.decoder import init_params
    from jaxrl_mt.models.hf_io import export_hf_folder
    from jaxrl_mt.models.registry import DEFAULT_MODEL, load_model

    base = load_model(DEFAULT_MODEL)
    cfg = ModelConfig(vocab_size=base.cfg.vocab_size, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, tie_word_embeddings=True,
                      max_position_embeddings=4096, bos_token_id=1, eos_token_id=(2,), pad_token_id=2)
    path = export_hf_folder(cfg, init_params(cfg, jax.random.PRNGKey(0), scale=0.5), f"{folder}/tiny-chat-llama",
                            tokenizer=base.tokenizer)
    return load_model(str(path))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m jaxrl_mt.serving.abuse", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--tiny", action="store_true", help="the tests' random tiny model instead of --model")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--big", type=int, default=4)
    p.add_argument("--slow", type=int, default=4)
    p.add_argument("--slow-s", type=float, default=3.0)
    p.add_argument("--long", type=int, default=3900, help="tokens of the long prompt (the probe's was ~8k; 0: none)")
    p.add_argument("--every-s", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    kw = dict(clients=args.clients, max_tokens=args.max_tokens, big=args.big, slow=args.slow, slow_s=args.slow_s,
              long=args.long, every_s=args.every_s, rounds=args.rounds)
    if args.tiny:
        with tempfile.TemporaryDirectory(prefix="jaxrl_mt_abuse_") as folder:
            result = run_abuse(tiny_model(folder), **kw)
    else:
        from jaxrl_mt.models.registry import load_model

        result = run_abuse(load_model(args.model), **kw)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

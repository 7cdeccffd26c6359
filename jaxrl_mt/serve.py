"""`python -m jaxrl_mt.serve --model SPEC --port 8000`: an OpenAI-compatible server on the JAX sampler.

    python -m jaxrl_mt.serve --model builtin:smollm2-135m-instruct --port 8000
    python -m jaxrl_mt.serve --model workdir:/runs/rlsta --served-model-name rlsta --port 8000

``SPEC`` is what ``jaxrl_mt.evaluate`` accepts (a registry spec, an HF folder, or
``workdir:PATH`` for a training run's policy, loaded by ``evaluate.load_eval_model``). Any
OpenAI client then talks to ``http://HOST:PORT/v1``; the model is named by
``--served-model-name`` (default: SPEC). Concurrent requests share the slot engine's decode
slots, a freed slot refilled with the next waiting request between segments (``--batch-window-ms``,
``--max-batch``; see ``jaxrl_mt.serving.batcher``). ``--port 0``
takes a free port; the first stdout line names the URL. A model that cannot be loaded ends the
command with one line on stderr and exit status 2.

Limits: request bodies over ``--max-body-bytes`` get 413; a request must arrive in full within
``--read-timeout`` seconds, else its connection is closed; a client that disconnects is one
log line and its generation stops within ``--slice-tokens`` decode steps (or one ``--prefill-tokens``
piece of its prompt); at most ``--max-batch`` rows hold a decode slot at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from jaxrl_mt.serving.protocol import DEFAULT_MAX_BODY_BYTES
from jaxrl_mt.serving.server import DEFAULT_READ_TIMEOUT_S, ServerThread, build_service

EXIT_BAD_INPUT = 2

__all__ = ["ServerThread", "build_service", "main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxrl_mt.serve", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model spec, or workdir:PATH of a training run")
    p.add_argument("--served-model-name", default="", help="the name clients use (default: the spec)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed at start)")
    p.add_argument("--dtype", default="float32", help="parameter and compute dtype (float32 | bfloat16)")
    p.add_argument("--max-batch", type=int, default=64, help="most rows per sampler call (a request's n choices "
                   "are n rows; the oldest requests first, the rest wait); a batch starts at once with this many "
                   "rows waiting")
    p.add_argument("--batch-window-ms", type=float, default=5.0, help="how long an idle server waits after a "
                                                                      "request for others to batch with it")
    p.add_argument("--default-max-tokens", type=int, default=256, help="reply budget of a request without max_tokens")
    p.add_argument("--min-prompt-bucket", type=int, default=32, help="smallest padded prompt length (fewer "
                                                                     "compiled shapes when larger)")
    p.add_argument("--seed", type=int, default=0, help="base seed of unseeded sampled requests")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="larger request bodies "
                                                                                     "are refused with 413")
    p.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S, help="seconds within which a "
                   "request's headers and body must arrive; then the connection is closed")
    p.add_argument("--slice-tokens", type=int, default=16, help="decode steps per segment at most: waiting "
                   "requests are admitted into freed slots and rows of clients that left are stopped between "
                   "segments (0: the engine's segment length)")
    p.add_argument("--prefill-tokens", type=int, default=512, help="a longer prompt is prefilled in pieces of "
                   "this many tokens, other rows decoding between pieces and a client that left dropped "
                   "(0: one prefill)")
    p.add_argument("--log-level", default="info", help="uvicorn log level")
    return p


def _log_to_stderr(level: str) -> None:
    """The serving package's lines (disconnects, failures) on stderr beside uvicorn's, at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    logger = logging.getLogger("jaxrl_mt.serving")
    logger.addHandler(handler)
    named = logging.getLevelName(level.upper())
    logger.setLevel(named if isinstance(named, int) else logging.DEBUG)  # uvicorn's "trace": everything
    logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Loads the model and serves it until interrupted; returns the exit status."""
    args = _parser().parse_args(argv)
    bad = [f"--{k.replace('_', '-')}={v}" for k, v in (("max_batch", args.max_batch),
                                                       ("default_max_tokens", args.default_max_tokens),
                                                       ("min_prompt_bucket", args.min_prompt_bucket),
                                                       ("max_body_bytes", args.max_body_bytes)) if v < 1]
    if args.batch_window_ms < 0 or not 0 <= args.port < 65536:
        bad.append(f"--batch-window-ms={args.batch_window_ms} / --port={args.port}")
    if not args.read_timeout > 0 or args.slice_tokens < 0 or args.prefill_tokens < 0:
        bad.append(f"--read-timeout={args.read_timeout} / --slice-tokens={args.slice_tokens} / "
                   f"--prefill-tokens={args.prefill_tokens}")
    if bad:
        print(f"error: bad value {bad[0]}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from jaxrl_mt.evaluate import load_eval_model

    try:
        model = load_eval_model(args.model, dtype=args.dtype)
    except Exception as e:  # noqa: BLE001 (any load failure: one line, exit 2)
        print(f"error: --model {args.model!r}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return EXIT_BAD_INPUT
    service = build_service(model, names=[args.served_model_name or args.model], max_batch=args.max_batch,
                            window_ms=args.batch_window_ms, default_max_tokens=args.default_max_tokens,
                            min_prompt_bucket=args.min_prompt_bucket, seed=args.seed, slice_tokens=args.slice_tokens,
                            max_body_bytes=args.max_body_bytes, prefill_tokens=args.prefill_tokens)
    _log_to_stderr(args.log_level)
    try:
        server = ServerThread(service, args.host, args.port, log_level=args.log_level, read_timeout=args.read_timeout)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"serving {service.names[0]!r} on {server.url} (batch window {args.batch_window_ms:g} ms, "
          f"max batch {args.max_batch})", flush=True)
    server.server.run(sockets=[server.sock])  # in the main thread: uvicorn handles SIGINT / SIGTERM
    return 0


if __name__ == "__main__":
    sys.exit(main())

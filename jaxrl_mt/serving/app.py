"""The Starlette application of the OpenAI-compatible server.

Routes: ``GET /v1/models``, ``GET /v1/models/{name}``, ``POST /v1/chat/completions`` (JSON, or
server-sent events with ``stream: true``), ``GET /health`` and ``GET /stats`` (batching
counters). Every refusal is an OpenAI-style JSON error: 400 for malformed JSON, a bad field, a
conversation the chat template cannot render or one that does not fit the context (code
``context_length_exceeded``, with the token counts), 404 for an unknown model or route, 413 for
a body over ``max_body_bytes`` (sent as soon as the ``Content-Length`` header shows it, before
the body is read; a body without one is counted as it arrives and refused at the limit), 500
when generation fails; none of them stops the server.

The event loop only moves bytes: parsing, validation, chat-template rendering and tokenization
run on a small thread pool (``prepare_workers``), generation and detokenization on the
batcher's worker, so a huge conversation does not delay other clients. Bodies over
``large_body_bytes`` are prepared in a lane of their own (one thread): big bodies queue behind
each other there, not in front of a small request. The work per request is bounded before the
template is rendered: each message adds at least ``message_tokens`` tokens to a prompt (measured
once on the chat template: two empty messages of a role against one, the least over the roles),
so a conversation of more messages than the context can hold (100,000 one-character messages,
3.4 MB) is refused at once with ``context_length_exceeded`` instead of seconds of rendering.

A client that disconnects is logged as one line (``client ... left ...``, counted as
``disconnects`` in ``/stats``) and its generation is cancelled: dropped from the queue or, when
its rows are decoding, stopped at the batcher's next segment (their slots go to waiting
requests). This holds for streamed and non-streamed requests (the latter watch the connection
while they wait).

Streaming sends the role chunk at once, then each choice's text as one delta when its job is
answered (rows decode in jitted segments of many steps and a job is detokenized once its choices
are done, so text is not available token by token), the finish reasons, an optional usage chunk
and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from jaxrl_mt.chat import ChatError, encode_prompt
from jaxrl_mt.sampling import Sampler
from jaxrl_mt.serving.batcher import Batcher, Job
from jaxrl_mt.serving.protocol import (
    DEFAULT_LARGE_BODY_BYTES,
    DEFAULT_MAX_BODY_BYTES,
    MAX_DRAIN_BYTES,
    ChatRequest,
    RequestError,
    chunk_body,
    completion_body,
    error_body,
    models_body,
    new_id,
    parse_chat_request,
)

__all__ = ["ChatService", "create_app"]

log = logging.getLogger(__name__)
MAX_CACHED_STOPS = 4096  # stop strings whose token lookup is remembered


def least_message_tokens(tokenizer: Any) -> int:
    """The fewest tokens one more message adds to a rendered conversation (0 when the template
    renders some role in no tokens, or refuses a repeated one: no bound)."""
    least = []
    for role in ("system", "user", "assistant"):
        try:
            one = len(encode_prompt(tokenizer, [{"role": role, "content": ""}]))
            least.append(len(encode_prompt(tokenizer, [{"role": role, "content": ""}] * 2)) - one)
        except Exception:  # noqa: BLE001 (any template failure: no bound)
            return 0
    return max(min(least), 0)


class ChatService:
    """Turns validated requests into batcher jobs (tokenization, context check, stop ids)."""

    def __init__(self, sampler: Sampler, names: Sequence[str], *, default_max_tokens: int = 256,
                 window_s: float = 0.005, max_rows: int = 64, seed: int = 0, slice_tokens: int = 16,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, prepare_workers: int = 2,
                 large_body_bytes: int = DEFAULT_LARGE_BODY_BYTES, prefill_tokens: int = 512):
        """Args:
          sampler: the served model's sampler (with its tokenizer and EOS ids).
          names: model names the server answers to (the first is listed first).
          default_max_tokens: reply budget of a request without ``max_tokens`` (capped by the context).
          window_s, max_rows, seed, slice_tokens, prefill_tokens: see ``Batcher``.
          max_body_bytes: larger request bodies are refused with 413.
          prepare_workers: threads that parse, render and tokenize requests off the event loop.
          large_body_bytes: larger bodies are prepared on a lane of their own (one thread).
        """
        if sampler.tokenizer is None:
            raise ValueError("ChatService needs a sampler with a tokenizer")
        if max_body_bytes < 1 or prepare_workers < 1 or large_body_bytes < 1:
            raise ValueError(f"ChatService: bad max_body_bytes={max_body_bytes}, prepare_workers={prepare_workers} "
                             f"or large_body_bytes={large_body_bytes}")
        self.sampler, self.names = sampler, list(names)
        self.default_max_tokens, self.max_body_bytes = default_max_tokens, max_body_bytes
        self.context = sampler.cfg.max_position_embeddings
        self.batcher = Batcher(sampler, window_s=window_s, max_rows=max_rows, seed=seed, slice_tokens=slice_tokens,
                               prefill_tokens=prefill_tokens)
        self.pool = ThreadPoolExecutor(max_workers=prepare_workers, thread_name_prefix="prepare")
        self.large_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare-large")
        self.large_body_bytes = large_body_bytes
        self.stats: Counter = Counter()  # disconnects, too_large, large_bodies
        self.created = int(time.time())
        self._stop_ids: dict[str, int | None] = {}
        self.message_tokens = least_message_tokens(sampler.tokenizer)


    def _single_token(self, stop: str) -> int | None:
        """The id of a stop string that is exactly one token (decoding stops there), else None."""
        if stop in self._stop_ids:
            return self._stop_ids[stop]
        tok = self.sampler.tokenizer
        ids = tok(stop, add_special_tokens=False)["input_ids"]
        found = ids[0] if len(ids) == 1 and tok.decode(ids) == stop else None
        if len(self._stop_ids) < MAX_CACHED_STOPS:
            self._stop_ids[stop] = found
        return found

    def prepare(self, raw: bytes) -> tuple[ChatRequest, Job]:
        """The validated request and its batcher job (CPU work: runs on ``pool``).

        Raises:
          RequestError: as ``parse_chat_request`` and ``job``.
        """
        req = parse_chat_request(raw)
        return req, self.job(req)

    def job(self, req: ChatRequest) -> Job:
        """The batcher job of a request.

        Raises:
          RequestError: 404 unknown model; 400 unrenderable conversation or context overflow.
        """
        if req.model not in self.names:
            raise RequestError(404, f"model {req.model!r} does not exist; this server serves "
                                    f"{', '.join(repr(n) for n in self.names)}", param="model",
                               code="model_not_found")
        least = len(req.messages) * self.message_tokens
        if least >= self.context:  # refused before rendering: bounded work for any number of messages
            raise RequestError(400, f"this model's maximum context length is {self.context} tokens; the "
                                    f"{len(req.messages)} messages take at least {least} tokens ({self.message_tokens} "
                                    "each); send fewer messages", param="messages", code="context_length_exceeded")
        try:
            prompt = encode_prompt(self.sampler.tokenizer, list(req.messages))
        except ChatError as e:
            raise RequestError(400, f"'messages': the chat template cannot render them: {e}", param="messages",
                               code="invalid_messages") from None
        room = self.context - len(prompt)
        budget = req.max_tokens if req.max_tokens is not None else min(self.default_max_tokens, room)
        if budget > room or room < 1:
            raise RequestError(400, f"this model's maximum context length is {self.context} tokens; the messages "
                                    f"take {len(prompt)} tokens and {budget} were asked for the reply "
                                    f"({len(prompt)} + {budget} > {self.context}); shorten the messages or lower "
                                    "max_tokens", param="messages", code="context_length_exceeded")
        extra = [self._single_token(s) for s in req.stop]
        stop_ids = tuple(dict.fromkeys([*self.sampler.eos_ids, *(i for i in extra if i is not None)]))
        return Job(prompt=prompt, budget=budget, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                   n=req.n, stops=req.stop, stop_ids=stop_ids)


def _error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code=code), status_code=status)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _events(service: ChatService, req: ChatRequest, job: Job, cid: str, model: str) -> AsyncIterator[str]:
    """The server-sent events of a streamed completion."""
    yield _sse(chunk_body(cid, model, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None} for i in range(req.n)]))
    try:
        choices = await service.batcher.submit(job)
    except asyncio.CancelledError:  # Starlette cancels the stream when the client disconnects
        _left(service, f"{cid} mid-stream; its generation is cancelled")
        raise
    except Exception as e:  # noqa: BLE001 (the stream is open: report in band)
        log.exception("generation failed")
        yield _sse(error_body(f"generation failed: {type(e).__name__}: {e}", "server_error"))
        yield "data: [DONE]\n\n"
        return
    for i, c in enumerate(choices):
        yield _sse(chunk_body(cid, model, [{"index": i, "delta": {"content": c.text}, "finish_reason": None}]))
    yield _sse(chunk_body(cid, model, [{"index": i, "delta": {}, "finish_reason": c.finish_reason}
                                       for i, c in enumerate(choices)]))
    if req.include_usage:
        used = sum(c.completion_tokens for c in choices)
        yield _sse(chunk_body(cid, model, [], usage={"prompt_tokens": len(job.prompt), "completion_tokens": used,
                                                      "total_tokens": len(job.prompt) + used}))
    yield "data: [DONE]\n\n"


def _left(service: ChatService, what: str) -> None:
    """Logs a client's disconnect as one line and counts it."""
    service.stats["disconnects"] += 1
    log.info("client left %s", what)


def _too_large(service: ChatService, size: str) -> RequestError:
    service.stats["too_large"] += 1
    return RequestError(413, f"the request body ({size} bytes) exceeds this server's limit of "
                             f"{service.max_body_bytes} bytes", code="request_too_large")


async def read_body(request: Request, service: ChatService) -> bytes:
    """The request body, refused with 413 once it exceeds ``service.max_body_bytes``.

    Raises:
      RequestError: 413, at once when ``Content-Length`` announces too much (the server drops the
        rest of the body after the response), else at the limit. A client that sent
        ``Connection: close`` gets it after its body was read and dropped (up to
        ``MAX_DRAIN_BYTES``): uvicorn closes such a connection as the response starts, and a
        close with unread bytes resets it, so a client that writes before it reads would see a
        reset instead of the 413.
      ClientDisconnect: the client left before the body was complete.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > service.max_body_bytes:
        if "close" in request.headers.get("connection", "").lower() and int(declared) <= MAX_DRAIN_BYTES:
            async for _ in request.stream():
                pass  # dropped as it arrives
        raise _too_large(service, declared)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > service.max_body_bytes:
            raise _too_large(service, f"more than {service.max_body_bytes}")
    return bytes(body)


async def _disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    """Returns when the client disconnects (call after the body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _complete(service: ChatService, request: Request, req: ChatRequest, job: Job, cid: str) -> Response:
    """A non-streamed completion; the job is cancelled if the client disconnects while it waits."""
    gen = asyncio.ensure_future(service.batcher.submit(job))
    gone = asyncio.ensure_future(_disconnect(request.receive))
    try:
        await asyncio.wait({gen, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not gen.done():
        gen.cancel()
        await asyncio.gather(gen, return_exceptions=True)  # the batcher has marked the job cancelled
        _left(service, f"{cid} while waiting for its reply; its generation is cancelled")
        return Response(status_code=499)  # nobody reads it
    try:
        choices = gen.result()
    except Exception as e:  # noqa: BLE001 (a 500 for this request; the server keeps serving)
        log.exception("generation failed")
        return _error(500, f"generation failed: {type(e).__name__}: {e}", "server_error")
    return JSONResponse(completion_body(cid, req.model, choices, len(job.prompt)))


def create_app(service: ChatService) -> Starlette:
    """The ASGI application serving ``service`` (the batcher starts with the application)."""

    async def chat_completions(request: Request) -> Response:
        cid = new_id()
        try:
            raw = await read_body(request, service)
            large = len(raw) > service.large_body_bytes
            service.stats["large_bodies"] += large
            lane = service.large_pool if large else service.pool
            req, job = await asyncio.get_running_loop().run_in_executor(lane, service.prepare, raw)
        except RequestError as e:
            return JSONResponse(e.body(), status_code=e.status)
        except ClientDisconnect:
            _left(service, f"{cid} before its request was read")
            return Response(status_code=499)  # nobody reads it
        if req.stream:
            return StreamingResponse(_events(service, req, job, cid, req.model), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _complete(service, request, req, job, cid)

    async def list_models(request: Request) -> Response:
        return JSONResponse(models_body(service.names, service.created))

    async def get_model(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in service.names:
            return _error(404, f"model {name!r} does not exist", "not_found_error", "model_not_found")
        return JSONResponse(models_body([name], service.created)["data"][0])

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def stats(request: Request) -> Response:
        return JSONResponse({**service.batcher.summary(), **{k: int(v) for k, v in service.stats.items()}})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.batcher.start()
        yield
        await service.batcher.stop()
        service.pool.shutdown(wait=False, cancel_futures=True)
        service.large_pool.shutdown(wait=False, cancel_futures=True)

    routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", list_models, methods=["GET"]),
              Route("/v1/models/{name:path}", get_model, methods=["GET"]),
              Route("/health", health, methods=["GET"]), Route("/stats", stats, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)

"""The Starlette application of the OpenAI-compatible server.

Routes: ``GET /v1/models``, ``GET /v1/models/{name}``, ``POST /v1/chat/completions`` (JSON, or
server-sent events with ``stream: true``), ``GET /health`` and ``GET /stats`` (batching
counters). Every refusal is an OpenAI-style JSON error: 400 for malformed JSON, a bad field, a
conversation the chat template cannot render or one that does not fit the context (code
``context_length_exceeded``, with the token counts), 404 for an unknown model or route, 500
when generation fails; none of them stops the server.

Streaming sends the role chunk at once, then each choice's text as one delta when its batch is
done (the sampler decodes a whole batch inside one jitted loop, so text is not available token
by token), the finish reasons, an optional usage chunk and ``[DONE]``. A client that leaves
before its batch runs is dropped from it; one that leaves later just misses its reply.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from jaxrl_mt.chat import ChatError, encode_prompt
from jaxrl_mt.sampling import Sampler
from jaxrl_mt.serving.batcher import Batcher, Job
from jaxrl_mt.serving.protocol import (
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


class ChatService:
    """Turns validated requests into batcher jobs (tokenization, context check, stop ids)."""

    def __init__(self, sampler: Sampler, names: Sequence[str], *, default_max_tokens: int = 256,
                 window_s: float = 0.005, max_rows: int = 64, seed: int = 0):
        """Args:
          sampler: the served model's sampler (with its tokenizer and EOS ids).
          names: model names the server answers to (the first is listed first).
          default_max_tokens: reply budget of a request without ``max_tokens`` (capped by the context).
          window_s, max_rows, seed: see ``Batcher``.
        """
        if sampler.tokenizer is None:
            raise ValueError("ChatService needs a sampler with a tokenizer")
        self.sampler, self.names = sampler, list(names)
        self.default_max_tokens = default_max_tokens
        self.context = sampler.cfg.max_position_embeddings
        self.batcher = Batcher(sampler, window_s=window_s, max_rows=max_rows, seed=seed)
        self.created = int(time.time())
        self._stop_ids: dict[str, int | None] = {}

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

    def job(self, req: ChatRequest) -> Job:
        """The batcher job of a request.

        Raises:
          RequestError: 404 unknown model; 400 unrenderable conversation or context overflow.
        """
        if req.model not in self.names:
            raise RequestError(404, f"model {req.model!r} does not exist; this server serves "
                                    f"{', '.join(repr(n) for n in self.names)}", param="model",
                               code="model_not_found")
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


def create_app(service: ChatService) -> Starlette:
    """The ASGI application serving ``service`` (the batcher starts with the application)."""

    async def chat_completions(request: Request) -> Response:
        try:
            req = parse_chat_request(await request.body())
            job = service.job(req)
        except RequestError as e:
            return JSONResponse(e.body(), status_code=e.status)
        cid = new_id()
        if req.stream:
            return StreamingResponse(_events(service, req, job, cid, req.model), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            choices = await service.batcher.submit(job)
        except Exception as e:  # noqa: BLE001 (a 500 for this request; the server keeps serving)
            log.exception("generation failed")
            return _error(500, f"generation failed: {type(e).__name__}: {e}", "server_error")
        return JSONResponse(completion_body(cid, req.model, choices, len(job.prompt)))

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
        return JSONResponse(service.batcher.summary())

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.batcher.start()
        yield
        await service.batcher.stop()

    routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", list_models, methods=["GET"]),
              Route("/v1/models/{name:path}", get_model, methods=["GET"]),
              Route("/health", health, methods=["GET"]), Route("/stats", stats, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)

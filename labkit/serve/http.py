"""The HTTP face of the engine: OpenAI-shaped /v1/completions and /v1/chat/completions (SSE streaming),
/v1/models, /health and Prometheus /metrics. `build_app(engine, settings)` makes the FastAPI app; the routes
read the EngineClient from `request.app.state.engine`.

Status codes: 400 invalid_request_error (bad JSON, a field out of range or beyond the engine's limits,
text that is not valid UTF-8, a body over --max-body-bytes), 404 not_found_error (another model), 503
overloaded_error / service_unavailable (queue full, shutting down, engine gone; with Retry-After where
waiting helps), 500 engine_error (the engine failed on this request; everyone else carries on).
Extensions: `ignore_eos`, `top_k`, `return_token_ids` (choices carry token_ids), `request_id`.
A client that disconnects cancels its request in the engine.
"""
from __future__ import annotations

import asyncio
import dataclasses
import uuid

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from labkit.serve import protocol
from labkit.serve.detokenize import IncrementalDetokenizer
from labkit.serve.engine_client import EngineClient, RequestStream
from labkit.serve.protocol import APIError, ChunkWriter, invalid

router = APIRouter()


@dataclasses.dataclass
class ServeSettings:
    model_name: str
    max_body_bytes: int = 4 << 20
    health_extra: dict = dataclasses.field(default_factory=dict)  # provenance /health reports


def build_app(engine: EngineClient, settings: ServeSettings) -> FastAPI:
    app = FastAPI(title="labkit serve", docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.settings = settings
    app.include_router(router)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    return app


# --- errors ----------------------------------------------------------------------------------------
def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _api_error(request: Request, exc: APIError):
    _count(request, exc.status)
    return _error_response(exc)


async def _validation_error(request: Request, exc: RequestValidationError):
    _count(request, 400)
    return _error_response(invalid(protocol.validation_message(exc.errors())))


async def _http_error(request: Request, exc: StarletteHTTPException):
    kind = {404: "not_found_error"}.get(exc.status_code, "invalid_request_error")
    return _error_response(APIError(exc.status_code, str(exc.detail), kind))


async def _unexpected_error(request: Request, exc: Exception):
    # A bug while serving one request fails that request only.
    import logging

    logging.getLogger("labkit.serve").exception("labkit serve: %s %s failed", request.method, request.url.path)
    _count(request, 500)
    return _error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error"))


def _count(request: Request, status: int) -> None:
    path = request.url.path
    if path.startswith("/v1/"):
        request.app.state.engine.metrics.http(path, status)


# --- plumbing --------------------------------------------------------------------------------------
async def _read_body(request: Request, limit: int):
    """The JSON body, refused (400) as soon as it grows past `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise invalid(f"body: {int(declared)} bytes is more than the server's limit of {limit} bytes "
                      "(--max-body-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise invalid(f"body: more than the server's limit of {limit} bytes (--max-body-bytes)")
        chunks.append(chunk)
    return protocol.parse_json(b"".join(chunks))


async def _tokenize(engine: EngineClient, fn, *args):
    """Tokenisation off the event loop: a long prompt must not stall /health or other streams."""
    try:
        return await asyncio.to_thread(fn, *args)
    except Exception as exc:  # noqa: BLE001 - the tokenizer refusing this text is the request's problem
        raise invalid(f"prompt: the tokenizer cannot encode it: {type(exc).__name__}: {exc}") from None


async def _generate(request: Request, endpoint: str, body: protocol._Sampling, prompt_ids: list[int], chat: bool,
                    default_max: int | None):
    engine: EngineClient = request.app.state.engine
    settings: ServeSettings = request.app.state.settings
    if engine.limits is None:
        raise APIError(503, "the engine is not ready", "service_unavailable")
    try:
        prompt_ids = engine.limits.check_token_ids(prompt_ids)
    except ValueError as exc:
        raise invalid(str(exc)) from None
    sp = protocol.sampling_params(body, prompt_ids, engine.limits, default_max)
    rid = body.request_id or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    stream = await engine.submit(rid, prompt_ids, protocol.sampling_dict(sp))
    engine.metrics.http(endpoint, 200)
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        writer = ChunkWriter(rid, settings.model_name, chat, body.return_token_ids)
        return StreamingResponse(_sse(engine, stream, writer, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Request-Id": rid})
    return await _complete(request, engine, stream, settings.model_name, chat, body.return_token_ids)


async def _complete(request: Request, engine: EngineClient, stream: RequestStream, model: str, chat: bool,
                    return_ids: bool):
    ids: list[int] = []
    collect = asyncio.ensure_future(_collect(stream, ids))
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collect.done():
            collect.cancel()
            engine.abort(stream.rid)
    if collect.cancelled() or not collect.done():
        return Response(status_code=499)
    if stream.error is not None:
        raise stream.error
    text = await asyncio.to_thread(engine.tokenizer.decode, ids, skip_special_tokens=True)
    return JSONResponse(protocol.completion_body(stream.rid, model, chat, text, stream.reason, stream.prompt_len,
                                                 len(ids), ids if return_ids else None),
                        headers={"X-Request-Id": stream.rid})


async def _collect(stream: RequestStream, ids: list[int]) -> None:
    while True:
        new, done = await stream.wait()
        ids.extend(new)
        if done:
            return


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _sse(engine: EngineClient, stream: RequestStream, writer: ChunkWriter, include_usage: bool):
    detok = IncrementalDetokenizer(engine.tokenizer)
    try:
        if writer.chat:
            yield writer.chunk("", None, role=True)
        while True:
            new, done = await stream.wait()
            if new:
                text = detok.add(new)
                # Half a character so far: nothing to show yet unless the client counts token ids.
                if text or writer.return_ids:
                    yield writer.chunk(text, None, new)
            if done:
                break
        if stream.error is not None:
            yield writer.error(stream.error)
        else:
            yield writer.chunk("" if not writer.chat else None, stream.reason, [])
            if include_usage:
                yield writer.usage(stream.prompt_len, stream.num_out)
        yield ChunkWriter.DONE
    finally:
        # Generator closed early (the client went away): the engine drops the request.
        if not stream.closed:
            engine.abort(stream.rid)


# --- routes ----------------------------------------------------------------------------------------
@router.post("/v1/completions")
async def completions(request: Request):
    engine: EngineClient = request.app.state.engine
    settings: ServeSettings = request.app.state.settings
    body = protocol.parse_body(protocol.CompletionRequest, await _read_body(request, settings.max_body_bytes))
    protocol.check_common(body, settings.model_name)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise invalid("prompt: a batch of prompts is not supported, send one string")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("prompt: empty string")
        ids = await _tokenize(engine, engine.tokenizer.encode, protocol.check_text("prompt", prompt))
    else:
        if not prompt:
            raise invalid("prompt: empty list of token ids")
        ids = list(prompt)
    return await _generate(request, "/v1/completions", body, ids, chat=False, default_max=16)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    engine: EngineClient = request.app.state.engine
    settings: ServeSettings = request.app.state.settings
    body = protocol.parse_body(protocol.ChatRequest, await _read_body(request, settings.max_body_bytes))
    protocol.check_common(body, settings.model_name)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    for i, m in enumerate(messages):
        if isinstance(m.get("content"), str):
            protocol.check_text(f"messages.{i}.content", m["content"])

    def render() -> list[int]:
        text = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return engine.tokenizer.encode(text, add_special_tokens=False)

    try:
        ids = await asyncio.to_thread(render)
    except Exception as exc:  # noqa: BLE001 - a template that cannot render these messages is the request's problem
        raise invalid(f"messages: the chat template failed: {type(exc).__name__}: {exc}") from None
    return await _generate(request, "/v1/chat/completions", body, ids, chat=True, default_max=None)


@router.get("/v1/models")
async def models(request: Request):
    engine: EngineClient = request.app.state.engine
    name = request.app.state.settings.model_name
    max_len = engine.limits.max_model_len if engine.limits else None
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "labkit",
                                        "max_model_len": max_len}]}


@router.get("/health")
async def health(request: Request):
    engine: EngineClient = request.app.state.engine
    settings: ServeSettings = request.app.state.settings
    info = engine.info
    body = {"model_name": settings.model_name, "device": info.get("device"), "device_name": info.get("device_name"),
            "tp": info.get("tp"), "async_scheduling": info.get("async_scheduling"),
            "vocab_size": (engine.limits.vocab_size if engine.limits else None),
            "max_model_len": (engine.limits.max_model_len if engine.limits else None),
            **settings.health_extra, **engine.stats, "live": engine.num_live, "queued": engine.num_waiting,
            "healthy": engine.healthy and not engine.draining}
    if engine.healthy and not engine.draining:
        return {"status": "ok", **body}
    reason = engine.dead or "the server is shutting down"
    return JSONResponse({"status": "unhealthy", "error": reason, **body}, status_code=503,
                        headers={"Retry-After": str(EngineClient.RETRY_AFTER_S)} if engine.dead is None else None)


@router.get("/metrics")
async def metrics(request: Request):
    engine: EngineClient = request.app.state.engine
    return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)


"""The HTTP face of the engine: OpenAI-shaped /v1/completions and /v1/chat/completions (SSE streaming),
/v1/models, /health and Prometheus /metrics. `build_app(engine, settings)` makes the FastAPI app; the routes
read the EngineClient from `request.app.state.engine`.

Status codes: 400 invalid_request_error (bad JSON, a field out of range or beyond the engine's limits,
text that is not valid UTF-8, a body over --max-body-bytes, a field the server does not implement), 404
not_found_error (another model), 408 (the body did not arrive within --body-timeout; the request line and
headers within --header-timeout, answered by server.py's protocol before any route), 503 overloaded_error /
service_unavailable (queue full, shutting down, engine gone; with Retry-After where waiting helps), 500
engine_error (the engine failed on this request; everyone else carries on).
Extensions: `ignore_eos`, `top_k`, `return_token_ids` (choices carry token_ids), `request_id`.

A request is owned from its first byte: everything that can fail for it alone (body, fields, ids, headers)
is checked before it reaches the engine, and from `submit` on, however the response ends (finished, the
client gone, an exception), the request leaves the engine. Each /v1/ request is counted once in
`labkit:http_requests_total`, with the status it was answered with.
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
from labkit.serve.detokenize import IncrementalDetokenizer, decode
from labkit.serve.engine_client import EngineClient, RequestStream
from labkit.serve.protocol import APIError, ChunkWriter, invalid

router = APIRouter()
COUNTED = ("/v1/completions", "/v1/chat/completions", "/v1/models")
CLIENT_GONE = 499  # nginx's code: the client left before any answer


@dataclasses.dataclass
class ServeSettings:
    model_name: str
    max_body_bytes: int = 4 << 20
    body_timeout_s: float = 30.0
    header_timeout_s: float = 30.0  # enforced by server.DeadlineH11Protocol, below the app
    health_extra: dict = dataclasses.field(default_factory=dict)  # provenance /health reports


def build_app(engine: EngineClient, settings: ServeSettings) -> FastAPI:
    app = FastAPI(title="labkit serve", docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.settings = settings
    app.include_router(router)
    app.add_middleware(CountRequests, metrics=engine.metrics)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    return app


# --- errors ----------------------------------------------------------------------------------------
def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _api_error(request: Request, exc: APIError):
    return _error_response(exc)


async def _validation_error(request: Request, exc: RequestValidationError):
    return _error_response(invalid(protocol.validation_message(exc.errors())))


async def _http_error(request: Request, exc: StarletteHTTPException):
    kind = {404: "not_found_error"}.get(exc.status_code, "invalid_request_error")
    return _error_response(APIError(exc.status_code, str(exc.detail), kind))


async def _unexpected_error(request: Request, exc: Exception):
    # A bug while serving one request fails that request only.
    import logging

    logging.getLogger("labkit.serve").exception("labkit serve: %s %s failed", request.method, request.url.path)
    return _error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error"))


class CountRequests:
    """ASGI middleware: one count per request, by the status its response started with (500 when an
    exception left it without one, 499 when the client left first). Counting in one place, after the fact,
    is what keeps a request from being counted once when it reached the engine and again when it failed."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in COUNTED:
            return await self.app(scope, receive, send)
        status = None

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception:
            status = status or 500
            raise
        finally:
            self.metrics.http(path, status or CLIENT_GONE)


# --- plumbing --------------------------------------------------------------------------------------
async def _read_body(request: Request, settings: ServeSettings):
    """The JSON body, refused (400) as soon as it grows past --max-body-bytes, and (408) when it has not all
    arrived within --body-timeout seconds: a client that sends a byte a minute must not hold a connection
    and its buffer forever."""
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise invalid(f"body: {int(declared)} bytes is more than the server's limit of {limit} bytes "
                      "(--max-body-bytes)")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(settings.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise invalid(f"body: more than the server's limit of {limit} bytes (--max-body-bytes)")
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(408, f"body: not received within {settings.body_timeout_s:g} s (--body-timeout); "
                       f"{size} bytes arrived", headers={"Connection": "close"}) from None
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
    headers = {"X-Request-Id": rid}
    writer = ChunkWriter(rid, settings.model_name, chat, body.return_token_ids) if body.stream else None
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    stream = await engine.submit(rid, prompt_ids, protocol.sampling_dict(sp))
    try:
        if writer is not None:
            return OwnedStream(engine, stream, _sse(engine, stream, writer, include_usage),
                               media_type="text/event-stream", headers={"Cache-Control": "no-cache", **headers})
        return await _complete(request, engine, stream, settings.model_name, chat, body.return_token_ids, headers)
    except BaseException:
        engine.abort(stream)  # whatever went wrong here, nobody will read this request's output
        raise


class OwnedStream(StreamingResponse):
    """A streamed response that takes its request out of the engine however it ends: finished, the client
    gone (starlette cancels the body iterator, which may never run its own clean-up), or an exception, even
    one before the first byte was sent."""

    def __init__(self, engine: EngineClient, stream: RequestStream, content, **kw):
        super().__init__(content, **kw)
        self._engine, self._stream = engine, stream

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._engine.abort(self._stream)


async def _complete(request: Request, engine: EngineClient, stream: RequestStream, model: str, chat: bool,
                    return_ids: bool, headers: dict):
    ids: list[int] = []
    collect = asyncio.ensure_future(_collect(stream, ids))
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collect.done():
            collect.cancel()
            engine.abort(stream)
    if collect.cancelled() or not collect.done():
        return Response(status_code=CLIENT_GONE)
    if stream.error is not None:
        raise stream.error
    text = await asyncio.to_thread(decode, engine.tokenizer, ids)
    return JSONResponse(protocol.completion_body(stream.rid, model, chat, text, stream.reason, stream.prompt_len,
                                                 len(ids), ids if return_ids else None), headers=headers)


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
        # The characters the output stopped in the middle of, as the non-streamed text has them.
        tail = detok.flush()
        yield writer.chunk(tail if tail or not writer.chat else None, stream.reason, [])
        if include_usage:
            yield writer.usage(stream.prompt_len, stream.num_out)
    yield ChunkWriter.DONE


# --- routes ----------------------------------------------------------------------------------------
@router.post("/v1/completions")
async def completions(request: Request):
    engine: EngineClient = request.app.state.engine
    settings: ServeSettings = request.app.state.settings
    body = protocol.parse_body(protocol.CompletionRequest, await _read_body(request, settings))
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
    body = protocol.parse_body(protocol.ChatRequest, await _read_body(request, settings))
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


@router.post("/tokenize")
async def tokenize(request: Request):
    """vLLM's /tokenize: {"prompt": text} or {"messages": [...]} -> {"count", "max_model_len", "tokens"}. Routers
    (vllm-router's cache- and KV-aware policies) ask it for a request's token ids before they pick a replica."""
    engine: EngineClient = request.app.state.engine
    settings: ServeSettings = request.app.state.settings
    if engine.limits is None:
        raise APIError(503, "the engine is not ready", "service_unavailable")
    body = protocol.parse_body(protocol.TokenizeRequest, await _read_body(request, settings))
    if body.model is not None and body.model != settings.model_name:
        raise APIError(404, f"model: {body.model!r} is not served here", "not_found_error")
    if (body.prompt is None) == (body.messages is None):
        raise invalid("prompt: give prompt or messages")
    if body.prompt is not None:
        ids = await _tokenize(engine, engine.tokenizer.encode, protocol.check_text("prompt", body.prompt))
    else:
        messages = [m.model_dump(exclude_none=True) for m in body.messages]

        def render() -> list[int]:
            text = engine.tokenizer.apply_chat_template(messages, tokenize=False,
                                                        add_generation_prompt=body.add_generation_prompt)
            return engine.tokenizer.encode(text, add_special_tokens=False)

        try:
            ids = await asyncio.to_thread(render)
        except Exception as exc:  # noqa: BLE001 - the request's problem
            raise invalid(f"messages: the chat template failed: {type(exc).__name__}: {exc}") from None
    return {"count": len(ids), "max_model_len": engine.limits.max_model_len, "tokens": ids}


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
            "startup_s": info.get("startup_s"),  # where the engine's init went, phase by phase
            "vocab_size": (engine.limits.vocab_size if engine.limits else None),
            "max_model_len": (engine.limits.max_model_len if engine.limits else None),
            **settings.health_extra, **engine.stats, "live": engine.num_live, "queued": engine.num_waiting,
            "healthy": engine.healthy and not engine.draining}
    if engine.healthy and not engine.draining:
        return {"status": "ok", **body}
    reason = engine.dead or "the server is shutting down"
    return JSONResponse({"status": "unhealthy", "error": reason, **body}, status_code=503,
                        headers={"Retry-After": str(EngineClient.RETRY_AFTER_S)} if engine.dead is None else None)


def _hub(engine: EngineClient):
    if engine.hub is None or engine.step_stream is None:
        raise APIError(404, "the step stream is off: start labkit serve with --step-stream", "not_found_error")
    return engine.hub


@router.get("/v1/steps")
async def steps(request: Request, rows: bool = True):
    """Server-sent events: `event: step` per engine step (step_stream.py's record), `event: summary` once a second
    (live_summary.py), `event: dropped` before the end when this client fell a whole queue behind. rows=false
    leaves out each step's per-request rows."""
    from labkit.serve.step_stream import STEP_TOPIC

    engine: EngineClient = request.app.state.engine
    hub = _hub(engine)
    sub = hub.subscribe(STEP_TOPIC)
    return StreamingResponse(_steps_sse(hub, sub, rows), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _steps_sse(hub, sub, rows: bool):
    import json

    try:
        yield ": labkit step stream\n\n"   # headers and a first byte now, before the first step
        while True:
            record = await sub.get()
            if record is None:
                if sub.dropped:
                    yield ("event: dropped\ndata: " + json.dumps({"reason": "this client fell behind by a whole "
                                                                 "queue of records"}) + "\n\n")
                return
            if record.get("kind") == "summary":
                yield "event: summary\ndata: " + json.dumps(record) + "\n\n"
                continue
            if not rows:
                record = {k: v for k, v in record.items() if k != "rows"}
            yield "event: step\ndata: " + json.dumps(record) + "\n\n"
    finally:
        hub.unsubscribe(sub)


@router.get("/v1/trace")
async def trace(request: Request, seconds: float = 10.0):
    """A window of the engine's event log (labkit serve --live-trace), one JSON event a line (schema v1): the state
    the window starts from (run_start, the live requests, a live_state), every event of the next `seconds`, and a
    closing live_state. `labkit trace --url` records and validates it."""
    import math

    from labkit.serve.live_trace import TRACE_TOPIC

    engine: EngineClient = request.app.state.engine
    if not engine.live_trace or engine.hub is None:
        raise APIError(404, "the live trace is off: start labkit serve with --live-trace", "not_found_error")
    if not (math.isfinite(seconds) and 0 < seconds <= TRACE_MAX_S):
        raise invalid(f"seconds: must be in (0, {TRACE_MAX_S}], got {seconds}")
    sub = engine.hub.subscribe(TRACE_TOPIC, queue_size=TRACE_QUEUE, lossless=True)
    token = uuid.uuid4().hex
    await engine.trace_window(token, True)
    return StreamingResponse(_trace_lines(engine, sub, token, seconds), media_type="application/x-ndjson",
                             headers={"Cache-Control": "no-cache"})


TRACE_MAX_S = 3600.0
TRACE_QUEUE = 1_000_000   # step batches a window may have waiting for a slow client before it is cut off
TRACE_OPEN_TIMEOUT_S = 30.0


async def _trace_lines(engine: EngineClient, sub, token: str, seconds: float):
    import json
    import time

    loop_start = time.monotonic()
    deadline, closing, done = None, False, False
    try:
        while True:
            now = time.monotonic()
            if deadline is None and now - loop_start > TRACE_OPEN_TIMEOUT_S:
                yield json.dumps({"error": "the engine core did not open the window"}) + "\n"
                return
            if deadline is not None and not closing and now >= deadline:
                await engine.trace_window(token, False)
                closing = True
            try:
                record = await asyncio.wait_for(sub.get(), 0.2)
            except TimeoutError:
                continue
            if record is None:
                why = ("this client fell behind and events were lost" if sub.dropped else "the server is stopping")
                yield json.dumps({"error": f"the window ended early: {why}"}) + "\n"
                return
            mark = record.get("mark")
            if mark is not None and mark != token:
                continue                      # another client's window
            if mark is None and deadline is None:
                continue                      # events of another window, before this one opened
            yield "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in record["events"])
            if mark is not None:
                if record["kind"] == "close":
                    done = True
                    return
                deadline = time.monotonic() + seconds
    finally:
        if not done:
            await engine.trace_window(token, False)
        if engine.hub is not None:
            engine.hub.unsubscribe(sub)


@router.get("/live")
async def live_page(request: Request):
    """The live page (labkit/data/live.html): plain HTML, JavaScript and SVG reading /v1/steps; nothing from
    the network."""
    from importlib.resources import files

    engine: EngineClient = request.app.state.engine
    _hub(engine)
    html = files("labkit").joinpath("data/live.html").read_text(encoding="utf-8")
    return Response(html, media_type="text/html; charset=utf-8")


@router.get("/metrics")
async def metrics(request: Request):
    engine: EngineClient = request.app.state.engine
    m = engine.metrics
    body = generate_latest(m.registry)
    if m.vllm_names is not None:   # --metric-names both: the same families under vLLM's names too
        body += generate_latest(m.vllm_names)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


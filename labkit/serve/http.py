"""The HTTP face of an EngineWorker: OpenAI-shaped completions and chat completions, SSE streaming,
/v1/models, /health and Prometheus /metrics. `create_app(worker, model_name)` builds it.

Error shape (every non-2xx): {"error": {"message": str, "type": str, "code": int}}
    400 invalid_request_error  bad JSON / fields, n != 1, empty prompt, prompt too long, ...
    404 not_found_error        a `model` other than the one served
    503 overloaded_error       --max-queue requests already wait; or service_unavailable (unhealthy)
    500 engine_error           the engine loop failed while the request was in flight
Extensions: `ignore_eos` (bool), `top_k` (int), `return_token_ids` (bool: choices carry token_ids),
`request_id` (str, else generated). A client that disconnects cancels its request in the engine.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine import SamplingParams
from labkit.serve.worker import EngineWorker, Event, Overloaded, RequestHandle, Unhealthy

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_


def _error(status: int, message: str, type_: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "code": status}}, status_code=status)


# --- request bodies --------------------------------------------------------------------------------
class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    stream: bool = False
    stream_options: Optional[dict] = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    request_id: Optional[str] = None
    stop: Optional[Union[str, list[str]]] = None
    logprobs: Optional[Union[bool, int]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str]]
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Union[str, list[dict], None] = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


# --- metrics ----------------------------------------------------------------------------------------
class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("labkit_requests", "HTTP requests by endpoint and outcome",
                                ["endpoint", "status"], registry=r)
        self.finished = Counter("labkit_request_finished", "Finished requests by finish_reason",
                                ["finish_reason"], registry=r)
        self.in_flight = Gauge("labkit_requests_in_flight", "Requests admitted and not yet finished", registry=r)
        self.ttft = Histogram("labkit_time_to_first_token_seconds", "Submit to first token (engine clock)",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("labkit_inter_token_latency_seconds", "Gap between a request's tokens (engine clock)",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.e2el = Histogram("labkit_e2e_request_latency_seconds", "Submit to finish (engine clock)",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.generation_tokens = Counter("labkit_generation_tokens", "Completion tokens produced", registry=r)
        self.prompt_tokens = Counter("labkit_prompt_tokens", "Prompt tokens admitted", registry=r)
        self.queued = Gauge("labkit_requests_queued", "Requests waiting to run", registry=r)
        self.running = Gauge("labkit_engine_running", "Sequences in the scheduler's running queue", registry=r)
        self.free_blocks = Gauge("labkit_kv_free_blocks", "Free KV cache blocks", registry=r)
        self.steps = Gauge("labkit_engine_steps", "Engine steps run by the worker", registry=r)
        self.healthy = Gauge("labkit_healthy", "1 while the engine loop is healthy", registry=r)


# --- incremental detokenization --------------------------------------------------------------------
class Detokenizer:
    """Decode all ids so far and emit the new suffix; a trailing U+FFFD (half a character) waits."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def add(self, ids, final: bool = False) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not final:
            text = text.rstrip("\ufffd")
        if not text.startswith(self.emitted):
            # Decoding changed an already emitted character (rare); emit only what is new past it.
            common = 0
            for a, b in zip(text, self.emitted):
                if a != b:
                    break
                common += 1
            delta = text[max(common, len(self.emitted)):] if len(text) > len(self.emitted) else ""
            self.emitted = text if len(text) > len(self.emitted) else self.emitted
            return delta
        delta = text[len(self.emitted):]
        self.emitted = text
        return delta


# --- the app ----------------------------------------------------------------------------------------
def create_app(worker: EngineWorker, model_name: str, *, close_worker: bool = False) -> FastAPI:
    """The FastAPI app serving `worker` under `model_name`. The lifespan starts the worker if needed
    (and closes it on shutdown when close_worker)."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not worker.healthy and worker.error is None:
            await asyncio.to_thread(worker.start)
        yield
        if close_worker:
            await asyncio.to_thread(worker.close)

    app = FastAPI(title="labkit serve", lifespan=lifespan)
    app.state.worker = worker
    app.state.metrics = metrics
    app.state.model_name = model_name

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        parts = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
        _count(request, 400)
        return _error(400, "; ".join(parts) or "invalid request", "invalid_request_error")

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        _count(request, exc.status)
        return _error(exc.status, exc.message, exc.type)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        return _error(exc.status_code, str(exc.detail), kind)

    def _count(request: Request, status: int) -> None:
        path = request.url.path
        if path.startswith("/v1/"):
            metrics.requests.labels(path, str(status)).inc()

    # --- plumbing -----------------------------------------------------------------------------------
    def _check_common(body: _Sampling) -> None:
        if body.model is not None and body.model != model_name:
            raise APIError(404, f"model: {body.model!r} is not served here (this server serves {model_name!r})",
                           "not_found_error")
        if body.n != 1:
            raise APIError(400, f"n: only n=1 is supported, got {body.n}")
        if body.stop:
            raise APIError(400, "stop: stop strings are not supported")
        if body.logprobs:
            raise APIError(400, "logprobs: not supported")
        if body.presence_penalty or body.frequency_penalty:
            raise APIError(400, "presence_penalty/frequency_penalty: not supported")

    def _sampling(body: _Sampling, prompt_len: int, default_max: int | None) -> SamplingParams:
        max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
        if max_tokens is None:
            max_tokens = default_max if default_max is not None else max(1, (worker.max_model_len or 1) - prompt_len)
        try:
            return SamplingParams(temperature=body.temperature, max_tokens=max_tokens, ignore_eos=body.ignore_eos,
                                  top_k=body.top_k, top_p=body.top_p)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None

    async def _submit(prompt_ids: list[int], sp: SamplingParams, request_id: str | None) -> tuple[RequestHandle, Event]:
        try:
            handle = worker.submit(prompt_ids, sp, request_id=request_id)
        except Overloaded as exc:
            raise APIError(503, str(exc), "overloaded_error") from None
        except Unhealthy as exc:
            raise APIError(503, str(exc), "service_unavailable") from None
        try:
            first = await handle.next_event()
        except BaseException:
            worker.cancel(handle.request_id)
            raise
        if first.type == "error":
            if first.error_type == "invalid_request":
                raise APIError(400, first.message or "invalid request")
            raise APIError(503 if first.error_type == "shutdown" else 500, first.message or "engine error",
                           "engine_error" if first.error_type == "engine_error" else "service_unavailable")
        if first.type == "finished":  # cancelled before admission
            raise APIError(503, "request cancelled before it was admitted", "service_unavailable")
        metrics.prompt_tokens.inc(len(prompt_ids))
        metrics.in_flight.inc()
        return handle, first

    class _Timing:
        def __init__(self, handle: RequestHandle):
            self.t0 = handle.t_submit_ns
            self.last: int | None = None

        def tokens(self, ev: Event) -> None:
            n = len(ev.token_ids)
            if not n:
                return
            if self.last is None:
                metrics.ttft.observe((ev.t_ns - self.t0) / 1e9)
                rest = n - 1
            else:
                gap = (ev.t_ns - self.last) / 1e9 / n
                for _ in range(n):
                    metrics.itl.observe(gap)
                rest = 0
            for _ in range(rest):
                metrics.itl.observe(0.0)
            self.last = ev.t_ns
            metrics.generation_tokens.inc(n)

        def end(self, ev: Event, reason: str) -> None:
            metrics.e2el.observe((ev.t_ns - self.t0) / 1e9)
            metrics.finished.labels(reason).inc()

    async def _generate(request: Request, endpoint: str, body: _Sampling, prompt_ids: list[int], chat: bool,
                        default_max: int | None):
        _check_common(body)
        sp = _sampling(body, len(prompt_ids), default_max)
        rid = body.request_id or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        handle, _ = await _submit(prompt_ids, sp, rid)
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if body.stream:
            metrics.requests.labels(endpoint, "200").inc()
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(_stream(handle, rid, created, chat, body.return_token_ids, include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Request-Id": rid})
        # Non-streaming: collect, but cancel the request if the client goes away meanwhile.
        collect = asyncio.ensure_future(_collect(handle))
        gone = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collect.done():
                collect.cancel()
                worker.cancel(rid)
                metrics.finished.labels("abort").inc()
                metrics.in_flight.dec()
        if not collect.done() or collect.cancelled():
            return Response(status_code=499)
        ids, reason, err = collect.result()
        metrics.in_flight.dec()
        if err is not None:
            raise APIError(500, err.message or "engine error", "engine_error")
        text = worker.tokenizer.decode(ids, skip_special_tokens=True)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
            choice["logprobs"] = None
        if body.return_token_ids:
            choice["token_ids"] = ids
        metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse({"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice],
                             "usage": _usage(len(prompt_ids), len(ids))}, headers={"X-Request-Id": rid})

    async def _wait_disconnect(request: Request) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    async def _collect(handle: RequestHandle):
        timing = _Timing(handle)
        ids: list[int] = []
        async for ev in handle:
            if ev.type == "tokens":
                timing.tokens(ev)
                ids.extend(ev.token_ids)
            elif ev.type == "finished":
                timing.end(ev, ev.finish_reason)
                return ids, ev.finish_reason, None
            elif ev.type == "error":
                metrics.finished.labels("error").inc()
                return ids, None, ev
        return ids, None, None

    def _usage(prompt: int, completion: int) -> dict:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def _stream(handle: RequestHandle, rid: str, created: int, chat: bool, return_ids: bool,
                      include_usage: bool):
        obj = "chat.completion.chunk" if chat else "text_completion"
        detok = Detokenizer(worker.tokenizer)
        timing = _Timing(handle)
        n_out = 0
        finished = False

        def chunk(delta_text: str | None, reason: str | None, ids=None, role: bool = False) -> str:
            choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
            if chat:
                delta: dict[str, Any] = {}
                if role:
                    delta["role"] = "assistant"
                if delta_text is not None:
                    delta["content"] = delta_text
                choice["delta"] = delta
            else:
                choice["text"] = delta_text or ""
                choice["logprobs"] = None
            if return_ids and ids is not None:
                choice["token_ids"] = list(ids)
            payload = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice]}
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        try:
            if chat:
                yield chunk("", None, role=True)
            async for ev in handle:
                if ev.type == "tokens":
                    timing.tokens(ev)
                    n_out += len(ev.token_ids)
                    yield chunk(detok.add(ev.token_ids), None, ev.token_ids)
                elif ev.type == "finished":
                    finished = True
                    timing.end(ev, ev.finish_reason)
                    tail = detok.add((), final=True)
                    yield chunk(tail if tail or not chat else None, ev.finish_reason, ())
                elif ev.type == "error":
                    finished = True
                    metrics.finished.labels("error").inc()
                    err = {"error": {"message": ev.message, "type": ev.error_type or "engine_error", "code": 500}}
                    yield f"data: {json.dumps(err)}\n\n"
            if include_usage:
                payload = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [],
                           "usage": _usage(len(handle.prompt_ids), n_out)}
                yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            # Client gone (generator closed or cancelled) before the end: the engine drops the request.
            if not finished:
                worker.cancel(handle.request_id)
                metrics.finished.labels("abort").inc()
            metrics.in_flight.dec()

    async def _json(request: Request) -> Any:
        try:
            return await request.json()
        except Exception:
            raise APIError(400, "the request body is not valid JSON") from None

    def _parse(model_cls, data: Any):
        from pydantic import ValidationError

        try:
            return model_cls.model_validate(data)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None

    # --- routes -------------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request):
        body: CompletionRequest = _parse(CompletionRequest, await _json(request))
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise APIError(400, "prompt: a batch of prompts is not supported, send one string")
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "prompt: empty string")
            ids = worker.tokenizer.encode(prompt)
        else:
            if not prompt:
                raise APIError(400, "prompt: empty list of token ids")
            ids = list(prompt)
        return await _generate(request, "/v1/completions", body, ids, chat=False, default_max=16)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body: ChatRequest = _parse(ChatRequest, await _json(request))
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        try:
            text = worker.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # a template that cannot render these messages is the request's problem
            raise APIError(400, f"messages: the chat template failed: {exc}") from None
        ids = worker.tokenizer.encode(text, add_special_tokens=False)
        return await _generate(request, "/v1/chat/completions", body, ids, chat=True, default_max=None)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "labkit",
                                            "max_model_len": worker.max_model_len}]}

    @app.get("/health")
    async def health():
        if worker.healthy:
            return {"status": "ok", **worker.stats()}
        return JSONResponse({"status": "unhealthy", "error": worker._unhealthy_reason()}, status_code=503)

    @app.get("/metrics")
    async def metrics_route():
        s = worker.stats()
        metrics.queued.set(s.get("queued", 0))
        metrics.running.set(s.get("running", 0))
        metrics.free_blocks.set(s.get("free_blocks", 0))
        metrics.steps.set(s.get("steps", 0))
        metrics.healthy.set(1 if worker.healthy else 0)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app

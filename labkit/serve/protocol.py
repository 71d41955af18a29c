"""The OpenAI wire format: request bodies, their validation against the engine's limits, response shapes.

Error body (every non-2xx): {"error": {"message": str, "type": str, "param": str|null, "code": int}}.
A message starts with the field it is about ("top_k: ..."), and `param` names that field.
"""
from __future__ import annotations

import json
import time
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import SamplingParams
from engine.request_limits import RequestLimits


class APIError(Exception):
    """Answered as {"error": ...} with `status`; `headers` (Retry-After, ...) go on the response."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.headers = status, message, type_, headers or {}

    @property
    def param(self) -> str | None:
        head, sep, _ = self.message.partition(":")
        return head if sep and head.replace("_", "").replace(".", "").isalnum() else None

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


def invalid(message: str) -> APIError:
    return APIError(400, message)


# --- request bodies --------------------------------------------------------------------------------
class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

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
    request_id: Optional[str] = Field(default=None, max_length=256)
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


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise invalid("body: not valid JSON") from None


def parse_body(model_cls, data: Any):
    """Pydantic validation with a 400 that names the fields."""
    if not isinstance(data, dict):
        raise invalid("body: expected a JSON object")
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise invalid(validation_message(exc.errors())) from None
    except RecursionError:
        raise invalid("body: nested too deeply") from None


def validation_message(errors) -> str:
    parts = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
    return "; ".join(parts) or "body: invalid request"


def check_text(field: str, text: str) -> str:
    """Text the tokenizer can take: valid Unicode that encodes as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(f"{field}: the text cannot be encoded as UTF-8 (a lone surrogate at character "
                      f"{exc.start})") from None
    return text


def check_common(body: _Sampling, model_name: str) -> None:
    if body.model is not None and body.model != model_name:
        raise APIError(404, f"model: {body.model!r} is not served here (this server serves {model_name!r})",
                       "not_found_error")
    if body.n != 1:
        raise invalid(f"n: only n=1 is supported, got {body.n}")
    if body.stop:
        raise invalid("stop: stop strings are not supported")
    if body.logprobs:
        raise invalid("logprobs: not supported")
    if body.presence_penalty or body.frequency_penalty:
        raise invalid("presence_penalty: penalties are not supported")


def sampling_params(body: _Sampling, prompt_ids: list[int], limits: RequestLimits,
                    default_max: int | None) -> SamplingParams:
    """SamplingParams for this body, checked against the engine's limits exactly as the engine will be."""
    room = limits.max_model_len - len(prompt_ids)
    if room < 1:
        raise invalid(f"prompt: {len(prompt_ids)} tokens leave no room for output under "
                      f"max_model_len={limits.max_model_len}")
    max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
    if max_tokens is None:
        max_tokens = room if default_max is None else min(default_max, room)
    try:
        sp = SamplingParams(temperature=body.temperature, max_tokens=max_tokens, ignore_eos=body.ignore_eos,
                            top_k=body.top_k, top_p=body.top_p)
        limits.check(prompt_ids, sp, within_model_len=True)
    except ValueError as exc:
        raise invalid(str(exc)) from None
    return sp


def sampling_dict(sp: SamplingParams) -> dict:
    return {"temperature": sp.temperature, "max_tokens": sp.max_tokens, "ignore_eos": sp.ignore_eos,
            "top_k": sp.top_k, "top_p": sp.top_p}


# --- responses ---------------------------------------------------------------------------------------
def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(rid: str, model: str, chat: bool, text: str, reason: str | None, prompt_tokens: int,
                    completion_tokens: int, token_ids: list[int] | None = None) -> dict:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
        choice["logprobs"] = None
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


class ChunkWriter:
    """Server-sent-event lines for one streamed request (OpenAI chunk objects)."""

    def __init__(self, rid: str, model: str, chat: bool, return_token_ids: bool):
        self.rid, self.model, self.chat, self.return_ids = rid, model, chat, return_token_ids
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.created = int(time.time())

    def _sse(self, payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def chunk(self, text: str | None, reason: str | None, token_ids: list[int] | None = None,
              role: bool = False) -> str:
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
            choice["logprobs"] = None
        if self.return_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        return self._sse({"id": self.rid, "object": self.obj, "created": self.created, "model": self.model,
                          "choices": [choice]})

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        return self._sse({"id": self.rid, "object": self.obj, "created": self.created, "model": self.model,
                          "choices": [], "usage": usage(prompt_tokens, completion_tokens)})

    def error(self, err: APIError) -> str:
        return self._sse(err.body())

    DONE = "data: [DONE]\n\n"


"""The OpenAI wire format: request bodies, their validation against the engine's limits, response shapes.

Error body (every non-2xx): {"error": {"message": str, "type": str, "param": str|null, "code": int}}.
A message starts with the field it is about ("top_k: ..."), and `param` names that field.
"""
from __future__ import annotations

import json
import time
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

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
# Strict: JSON `true` is not the token id 1, "2" is not max_tokens 2. Forbid: a field the server does not
# implement is a 400 naming it, never silently ignored (`validation_message` words extra_forbidden).
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
REQUEST_ID_MAX = 256


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = _STRICT

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: Optional[int] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    request_id: Optional[str] = None
    user: Optional[str] = None  # OpenAI's end-user label: it asks nothing of the output
    # OpenAI fields accepted only at the value that asks for nothing (check_common refuses the rest), so a
    # client that spells out the defaults is served.
    n: int = 1
    stop: Optional[Union[str, list[str]]] = None
    logprobs: Optional[Union[bool, int]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Optional[dict] = None
    # What routers add to every request they forward (vllm-router and sglang-router spell out SGLang's defaults):
    # accepted at the value that asks for nothing of this server (check_common refuses the others).
    skip_special_tokens: bool = True      # the server's detokenizer skips them
    no_stop_trim: bool = False            # there are no stop strings to trim
    return_hidden_states: bool = False

    @field_validator("request_id")
    @classmethod
    def _request_id(cls, v: Optional[str]) -> Optional[str]:
        # It goes back in the X-Request-Id header: printable ASCII, no leading or trailing space, bounded.
        if v is not None and not (0 < len(v) <= REQUEST_ID_MAX and v.isascii() and v.isprintable()
                                  and v.strip() == v):
            raise PydanticCustomError("request_id", f"must be 1 to {REQUEST_ID_MAX} printable ASCII characters "
                                      "without leading or trailing spaces (it is sent back as X-Request-Id)")
        return v


class CompletionRequest(_Sampling):
    prompt: Any
    echo: bool = False
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, str):
            return v
        if isinstance(v, list) and (all(type(t) is int for t in v) or all(isinstance(t, str) for t in v)):
            return v
        raise PydanticCustomError("prompt", "must be a string, a list of token ids (integers) or a list of one "
                                  "string")


class ChatMessage(BaseModel):
    # The template may use more than role and content (name, tool_calls, ...): those pass through to it.
    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: Union[str, list[dict], None] = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    top_logprobs: Optional[int] = None
    # Routers' defaults again: no reasoning parser here, so there is no reasoning to separate, stream or include
    # apart from the content (they ask nothing at these values).
    continue_final_message: bool = False
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    include_reasoning: bool = True


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize body (a prompt, or chat messages)."""
    model_config = _STRICT
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = Field(None, min_length=1)   # (as /v1/chat/completions takes them)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class _TooManyNumbers(Exception):
    pass


NUMBERS_BESIDE_PROMPT = 64  # integers a completion body may hold besides its prompt (max_tokens, seed, ...)


def parse_json(raw: bytes, max_prompt_ids: int | None = None) -> Any:
    """The body as JSON. max_prompt_ids (max_model_len): refuse, while parsing, a body holding more numbers
    than a prompt of that many ids and the other fields can (NUMBERS_BESIDE_PROMPT): a 4 MiB list of ids is
    stopped after a few thousand instead of being built whole on the event loop (json's C parser holds the GIL
    throughout, so a thread would not free the loop)."""
    hooks = {}
    if max_prompt_ids is not None:
        most, seen = max_prompt_ids + NUMBERS_BESIDE_PROMPT, 0

        def counted(convert):
            def parse(digits: str):
                nonlocal seen
                seen += 1
                if seen > most:
                    raise _TooManyNumbers
                return convert(digits)
            return parse
        hooks = {"parse_int": counted(int), "parse_float": counted(float)}
    try:
        return json.loads(raw, **hooks)
    except _TooManyNumbers:
        raise invalid(f"prompt: more token ids than max_model_len={max_prompt_ids} (the body holds more than "
                      f"{max_prompt_ids + NUMBERS_BESIDE_PROMPT} numbers)") from None
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
        msg = "not supported by this server" if e.get("type") == "extra_forbidden" else str(e.get("msg"))
        parts.append(f"{loc}: {msg}" if loc else msg)
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
    refused = [("n", body.n != 1, f"only n=1 is supported, got {body.n}"),
               ("stop", bool(body.stop), "stop strings are not supported"),
               ("logprobs", bool(body.logprobs), "not supported"),
               ("top_logprobs", bool(getattr(body, "top_logprobs", None)), "not supported"),
               ("presence_penalty", body.presence_penalty != 0, "penalties are not supported"),
               ("frequency_penalty", body.frequency_penalty != 0, "penalties are not supported"),
               ("logit_bias", bool(body.logit_bias), "not supported"),
               ("echo", bool(getattr(body, "echo", False)), "echoing the prompt is not supported"),
               ("best_of", getattr(body, "best_of", None) not in (None, 1), "only best_of=1 is supported"),
               ("suffix", bool(getattr(body, "suffix", None)), "not supported"),
               ("skip_special_tokens", body.skip_special_tokens is not True, "special tokens are always skipped"),
               ("no_stop_trim", body.no_stop_trim, "there are no stop strings to trim"),
               ("return_hidden_states", body.return_hidden_states, "not supported"),
               ("continue_final_message", bool(getattr(body, "continue_final_message", False)), "not supported"),
               *((f, getattr(body, f, True) is not True, "no reasoning parser: only true is accepted")
                 for f in ("separate_reasoning", "stream_reasoning", "include_reasoning"))]
    for field, bad, why in refused:
        if bad:
            raise invalid(f"{field}: {why}")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options: only allowed with stream=true")


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
                            top_k=body.top_k, top_p=body.top_p, seed=body.seed)
        limits.check(prompt_ids, sp, within_model_len=True)
    except ValueError as exc:
        raise invalid(str(exc)) from None
    return sp


def sampling_dict(sp: SamplingParams) -> dict:
    return {"temperature": sp.temperature, "max_tokens": sp.max_tokens, "ignore_eos": sp.ignore_eos,
            "top_k": sp.top_k, "top_p": sp.top_p, "seed": sp.seed}


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


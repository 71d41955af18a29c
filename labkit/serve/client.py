"""`labkit serve client`: send one request, print the text as it arrives, record per-token timing.

JSONL (schema v1, observer "client", monotonic t_ns): client_start, token (index, text, token_ids,
ttft_ms on the first, itl_ms after), finished (finish_reason, usage, ttft_ms, tpot_ms, e2el_ms,
num_tokens; ttft_ms and tpot_ms None without --stream, which does not see the first token), or error (status,
message).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from labkit.errors import LabkitError
from labkit.options import Out


class _Log:
    def __init__(self, path: Optional[Path], run: str):
        self.run = run
        self.f = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.f = open(path, "w", encoding="utf-8")

    def emit(self, event: str, **fields) -> None:
        if self.f is not None:
            rec = {"v": 1, "event": event, "run": self.run, "t_ns": time.monotonic_ns(), "step": None,
                   "observer": "client", **fields}
            self.f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def _error_message(resp) -> str:
    try:
        return resp.json()["error"]["message"]
    except Exception:  # noqa: BLE001 - any body
        return resp.text[:200]


def request(url: str, prompt: str, max_tokens: int = 16, stream: bool = False, out: Optional[Path] = None,
            chat: bool = False, temperature: float = 0.0, ignore_eos: bool = False, timeout: float = 300.0,
            echo=print) -> dict:
    """Run one request; returns {text, finish_reason, usage, ttft_ms, itl_ms: [...], e2el_ms, ...}."""
    try:
        import httpx
    except ImportError:
        raise LabkitError("the serve client needs httpx: pip install 'labkit[serve]'", 2) from None
    base = url.rstrip("/")
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict = {"max_tokens": max_tokens, "temperature": temperature, "ignore_eos": ignore_eos,
                  "stream": stream, "return_token_ids": True}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    log = _Log(out, f"client-{int(time.time())}")
    log.emit("client_start", url=base + endpoint, request=body)
    t0 = time.monotonic_ns()
    result: dict = {"text": "", "finish_reason": None, "usage": None, "ttft_ms": None, "itl_ms": [], "token_ids": []}
    last = None
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0)) as http:
            if not stream:
                resp = http.post(base + endpoint, json=body)
                if resp.status_code != 200:
                    log.emit("error", status=resp.status_code, message=_error_message(resp))
                    raise LabkitError(f"server answered {resp.status_code}: {_error_message(resp)}", 2)
                data = resp.json()
                choice = data["choices"][0]
                text = choice["message"]["content"] if chat else choice["text"]
                # Unstreamed, the first token's time is not seen: ttft_ms and tpot_ms stay None (the whole
                # answer's time as a TTFT would make TPOT ~0), e2el_ms is the figure.
                result.update(text=text, finish_reason=choice["finish_reason"], usage=data.get("usage"),
                              token_ids=choice.get("token_ids", []))
                echo(text)
            else:
                with http.stream("POST", base + endpoint, json=body) as resp:
                    if resp.status_code != 200:
                        resp.read()
                        log.emit("error", status=resp.status_code, message=_error_message(resp))
                        raise LabkitError(f"server answered {resp.status_code}: {_error_message(resp)}", 2)
                    for line in resp.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        payload = line[len("data: "):]
                        if payload == "[DONE]":
                            break
                        data = json.loads(payload)
                        if "error" in data:
                            log.emit("error", status=500, message=data["error"].get("message"))
                            raise LabkitError(f"server error mid-stream: {data['error'].get('message')}", 2)
                        if data.get("usage"):
                            result["usage"] = data["usage"]
                        for choice in data.get("choices", []):
                            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                            ids = choice.get("token_ids") or []
                            if choice.get("finish_reason"):
                                result["finish_reason"] = choice["finish_reason"]
                            if not ids and not text:
                                continue
                            t = time.monotonic_ns()
                            fields: dict = {"index": len(result["token_ids"]), "text": text or "", "token_ids": ids}
                            if ids:
                                if last is None:
                                    result["ttft_ms"] = fields["ttft_ms"] = (t - t0) / 1e6
                                else:
                                    itl = (t - last) / 1e6
                                    result["itl_ms"].append(itl)
                                    fields["itl_ms"] = itl
                                last = t
                                result["token_ids"].extend(ids)
                            result["text"] += text or ""
                            log.emit("token", **fields)
                            if text:
                                echo(text, end="", flush=True)
                echo("")
    except httpx.HTTPError as exc:
        log.emit("error", status=None, message=f"{type(exc).__name__}: {exc}")
        log.close()
        raise LabkitError(f"cannot reach {base}: {type(exc).__name__}: {exc}", 2) from None
    except BaseException:
        log.close()
        raise
    e2el = (time.monotonic_ns() - t0) / 1e6
    n = len(result["token_ids"]) or ((result["usage"] or {}).get("completion_tokens") or 0)
    tpot = (e2el - result["ttft_ms"]) / (n - 1) if n > 1 and result["ttft_ms"] is not None else None
    result.update(e2el_ms=e2el, tpot_ms=tpot, num_tokens=n)
    log.emit("finished", finish_reason=result["finish_reason"], usage=result["usage"], ttft_ms=result["ttft_ms"],
             tpot_ms=tpot, e2el_ms=e2el, num_tokens=n)
    log.close()
    return result


def run(
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="The server's base URL."),
    prompt: str = typer.Option(..., "--prompt", help="The prompt text."),
    max_tokens: int = typer.Option(16, "--max-tokens", min=1, help="Tokens to generate at most."),
    stream: bool = typer.Option(False, "--stream/--no-stream", help="Stream tokens as they arrive (SSE)."),
    out: Out("Per-token events (JSONL) to this file.") = None,
    chat: bool = typer.Option(False, "--chat", help="Send the prompt as one user message to /v1/chat/completions."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Keep generating past EOS (to max tokens)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the server."),
) -> None:
    """Send one request to a running `labkit serve`; print tokens as they arrive; --out writes per-token timings.

    Example: labkit serve client --prompt "Hello" --stream --out runs/client.jsonl
    """
    res = request(url, prompt, max_tokens=max_tokens, stream=stream, out=out, chat=chat, temperature=temperature,
                  ignore_eos=ignore_eos, timeout=timeout)
    ttft = f"{res['ttft_ms']:.1f}" if res["ttft_ms"] is not None else "-"
    itl = res["itl_ms"]
    itl_s = f"{sum(itl) / len(itl):.1f}" if itl else "-"
    print(f"finish_reason={res['finish_reason']} tokens={res['num_tokens']} ttft_ms={ttft} mean_itl_ms={itl_s} "
          f"e2el_ms={res['e2el_ms']:.1f}" + (f" out={out}" if out else ""), file=sys.stderr)

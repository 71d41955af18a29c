"""A stand-in for `labkit serve` that costs little to run: plain asyncio, no engine, no tokenizer.

GET /health answers a JSON document of our choosing (provenance tests: a full new-style /health, another
model's hash). POST /v1/completions streams SSE events shaped like labkit serve's (return_token_ids on): a
"step" loop, like an engine's, gives every open stream `--tokens-per-step` tokens per step and writes them
as one event; a stream whose client has fallen behind (its socket buffer is full) gets its tokens held and
then coalesced into one event with several token_ids, as the serving frontend does. Then a finish event, a
usage event and [DONE]. With --step-ms 0 it steps as fast as it can, so a client measured against it
measures the client (scripts/client_throughput.py).

    python -m tests.fake_sse_server --port 8123 [--health '{"status": "ok", ...}'] [--step-ms 0]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import threading

DEFAULT_HEALTH = {"status": "ok", "model_name": "fake", "device": "cpu", "device_name": None, "vocab_size": 1000}
_HEAD = {"id": "cmpl-fake0123456789", "object": "text_completion", "created": 1700000000, "model": "fake"}
_BACKLOG = 64 * 1024   # bytes waiting in a stream's transport before its tokens are held back and coalesced


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (Transfer-Encoding: chunked) holding `data`."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(payload: dict) -> bytes:
    return _chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")


_token_events: dict[int, bytes] = {}


def token_event(n: int) -> bytes:
    """The event of n tokens (cached: the fake server spends its time writing, not formatting)."""
    if n not in _token_events:
        _token_events[n] = _event({**_HEAD, "choices": [{"index": 0, "finish_reason": None, "text": " tok" * n,
                                                         "logprobs": None, "token_ids": [123] * n}]})
    return _token_events[n]


def tail_events(prompt_tokens: int, completion_tokens: int) -> bytes:
    return (_event({**_HEAD, "choices": [{"index": 0, "finish_reason": "length", "text": "", "logprobs": None,
                                          "token_ids": []}]})
            + _event({**_HEAD, "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                        "completion_tokens": completion_tokens,
                                                        "total_tokens": prompt_tokens + completion_tokens}})
            + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


class _Open:
    def __init__(self, writer: asyncio.StreamWriter, max_tokens: int):
        self.writer, self.left, self.held = writer, max_tokens, 0
        self.finished = asyncio.get_running_loop().create_future()


class FakeServer:
    def __init__(self, health: dict | None = None, tokens_per_step: int = 1, step_ms: float = 0.0):
        self.health = DEFAULT_HEALTH if health is None else health
        self.tokens_per_step = tokens_per_step
        self.step_s = step_ms / 1000
        self.completions = 0          # requests served: tests check who got how many
        self._open: list[_Open] = []
        self._wake: asyncio.Event | None = None

    async def _steps(self) -> None:
        while True:
            if not self._open:
                self._wake.clear()
                await self._wake.wait()
            for s in list(self._open):
                n = min(self.tokens_per_step, s.left)
                s.left -= n
                s.held += n
                if s.writer.transport.get_write_buffer_size() < _BACKLOG or s.left == 0:
                    s.writer.write(token_event(s.held))
                    s.held = 0
                if s.left == 0:
                    self._open.remove(s)
                    s.finished.set_result(None)
            await asyncio.sleep(self.step_s)

    async def _complete(self, req: dict, writer: asyncio.StreamWriter) -> None:
        self.completions += 1
        prompt = req.get("prompt")
        max_tokens = int(req["max_tokens"])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        s = _Open(writer, max_tokens)
        self._open.append(s)
        self._wake.set()
        await s.finished
        writer.write(tail_events(len(prompt) if isinstance(prompt, list) else 1, max_tokens))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "GET" and path == "/health":
                    data = json.dumps(self.health).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(data), data))
                elif method == "POST" and path == "/v1/completions":
                    await self._complete(json.loads(body), writer)
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def serve(self, port: int, ready: threading.Event | None = None) -> None:
        self._wake = asyncio.Event()
        stepper = asyncio.create_task(self._steps())
        server = await asyncio.start_server(self.handle, "127.0.0.1", port, backlog=1024)
        self.port = server.sockets[0].getsockname()[1]
        if ready is not None:
            ready.set()
        async with server:
            await server.serve_forever()
        stepper.cancel()


def start_in_thread(**kwargs) -> FakeServer:
    """A FakeServer on a free loopback port, in a daemon thread (it ends with the test process)."""
    fake = FakeServer(**kwargs)
    ready = threading.Event()
    threading.Thread(target=lambda: asyncio.run(fake.serve(0, ready)), daemon=True).start()
    if not ready.wait(10):
        raise RuntimeError("the fake SSE server did not start")
    fake.url = f"http://127.0.0.1:{fake.port}"
    return fake


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--health", default=None, help="JSON document /health answers (default: a minimal one)")
    ap.add_argument("--tokens-per-step", type=int, default=1)
    ap.add_argument("--step-ms", type=float, default=0.0, help="pause between steps (0: as fast as it can)")
    args = ap.parse_args()
    fake = FakeServer(json.loads(args.health) if args.health else None, args.tokens_per_step, args.step_ms)
    asyncio.run(fake.serve(args.port))


if __name__ == "__main__":
    main()

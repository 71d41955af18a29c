"""`labkit serve`: an OpenAI-compatible HTTP server around the engine, and a client for it.

    labkit serve --model DIR --port 8000                 # http://127.0.0.1:8000/v1/completions ...
    labkit serve --tp 2 --device cpu --max-queue 32
    labkit serve client --url http://127.0.0.1:8000 --prompt "Hello" --stream --out runs/client.jsonl

Listens on loopback only unless --allow-remote. The engine runs in its own process (core.py); this one
serves HTTP (docs/serving.md). SIGTERM / SIGINT drain for --drain-timeout seconds, then exit 0.
Exit 2 when it cannot run (missing fastapi/uvicorn/pyzmq/msgpack, bad model, port in use, bad engine
arguments); exit 1 when the engine dies while serving.
"""
from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Optional

import typer

from labkit.errors import LabkitError
from labkit.options import (AsyncSchedulingOption, BlockSizeOption, BudgetOption, Device, DeviceOption, EagerOption, MaxModelLenOption,
                            MaxNumSeqsOption, MaxQueueOption, ModelOption, NumBlocksOption, Policy, PolicyOption,
                            TpOption)
from labkit.output import resolve_device
from labkit.serve import client as client_mod

app = typer.Typer(invoke_without_command=True, no_args_is_help=False)

app.command("client")(client_mod.run)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _need_serve_packages() -> None:
    missing = []
    for mod in ("fastapi", "uvicorn", "prometheus_client", "zmq", "msgpack"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise LabkitError(f"labkit serve needs {', '.join(missing)}: pip install 'labkit[serve]'", 2)


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise LabkitError(f"--host/--port: cannot listen on {host}:{port}: {exc.strerror or exc}", 2) from None


@app.callback()
def serve(
    ctx: typer.Context,
    model: ModelOption = None,
    device: DeviceOption = Device.auto,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback unless --allow-remote)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback --host."),
    tp: TpOption = 1,
    max_num_seqs: MaxNumSeqsOption = None,
    budget: BudgetOption = None,
    max_model_len: MaxModelLenOption = None,
    block_size: BlockSizeOption = None,
    num_blocks: NumBlocksOption = None,
    eager: EagerOption = None,
    async_scheduling: AsyncSchedulingOption = None,
    policy: PolicyOption = Policy.prefill_first,
    max_queue: MaxQueueOption = 256,
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", min=0.0, help="On SIGTERM/SIGINT, seconds "
                                        "in-flight requests may take to finish before they are cancelled."),
    max_body_bytes: int = typer.Option(4 << 20, "--max-body-bytes", min=1024, help="Largest request body "
                                       "accepted (bytes); larger ones get 400."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="Model name in the API (default: the folder name)."),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Write the engine's JSONL event log (schema v1) "
                                        "here: which requests ran in which step, as the server admitted them."),
) -> None:
    """Serve the engine over OpenAI-shaped HTTP (/v1/completions, /v1/chat/completions, /health, /metrics).

    Listens on loopback only unless --allow-remote. Engine options left out take the engine's defaults.
    SIGTERM or SIGINT drains for --drain-timeout seconds, then exits 0; exit 1 when the engine dies while serving.
    `labkit serve client` sends one request.

    Example: labkit serve --device cpu --port 8000
    """
    if ctx.invoked_subcommand is not None:
        return
    _need_serve_packages()
    if not is_loopback(host) and not allow_remote:
        raise LabkitError(f"--host {host}: not a loopback address; the server has no authentication, "
                          "pass --allow-remote to listen on it anyway", 2)
    from labkit.model import resolve_model

    model_dir = resolve_model(model)
    dev = resolve_device(device)
    kwargs = {"device": dev, "tensor_parallel_size": tp, "scheduling_policy": policy.value}
    for key, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", budget),
                       ("max_model_len", max_model_len), ("enforce_eager", eager),
                       ("kvcache_block_size", block_size), ("num_kvcache_blocks", num_blocks),
                       ("async_scheduling", async_scheduling)):
        if value is not None:
            kwargs[key] = value
    _check_port(host, port)

    import asyncio

    from labkit import __version__
    from labkit.output import config_sha256, git_head
    from labkit.serve.http import ServeSettings
    from labkit.serve.server import serve_async, setup_logging

    name = served_model_name or model_dir.name
    setup_logging()
    settings = ServeSettings(model_name=name, max_body_bytes=max_body_bytes, health_extra={
        "model": {"path": str(model_dir), "config_sha256": config_sha256(model_dir)}, "git_head": git_head(),
        "labkit_version": __version__})

    def ready(engine) -> None:
        print(f"labkit serve: model {name!r} on {engine.info.get('device')} (tp={tp}) ready at http://{host}:{port} "
              "(/v1/completions, /v1/chat/completions, /health, /metrics)", file=sys.stderr, flush=True)

    print(f"labkit serve: loading {model_dir} on {dev} (tp={tp})", file=sys.stderr, flush=True)
    code = asyncio.run(serve_async(str(model_dir), kwargs, settings, host=host, port=port, max_queue=max_queue,
                                   drain_s=drain_timeout, log_level=log_level, trace_path=trace, on_ready=ready))
    if code == 2:
        raise LabkitError(f"the server could not start on {host}:{port}", 2)
    if code:
        raise LabkitError("the engine died while serving (see the log above)", code)

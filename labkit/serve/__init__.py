"""`labkit serve`: an OpenAI-shaped HTTP service; the engine steps in a process of its own.

    core.py           the engine-core process: owns the LLM, steps it, sends each step's outputs at once
    engine_client.py  the frontend's handle on it: spawn, submit/abort, route outputs to request streams
    protocol.py       the OpenAI wire format: bodies, validation against the engine's limits, responses
    detokenize.py     incremental detokenisation (O(1) per token)
    metrics.py        Prometheus families named as vLLM's
    http.py           the FastAPI routes (/v1/completions, /v1/chat/completions, /v1/models, /tokenize, /health,
                      /metrics, /v1/steps, /live, /v1/trace)
    step_stream.py    --step-stream: each step's record (ForwardPassMetrics' fields and labkit's), PUB socket
    stream_hub.py     the frontend's subscriber to the core's stream: bounded queues, slow clients dropped
    live_summary.py   the once-a-second summary on the stream (/metrics totals, windowed latency percentiles)
    kv_events.py      --kv-events: the prefix cache's changes in vLLM's KV-event schema, and a mirror of them
    live_trace.py     --live-trace: the tracer whose windows `labkit trace --url` records
    server.py         uvicorn with drain-then-exit on SIGTERM/SIGINT, deadlines on slow senders; exit 1 when the
                      engine dies
    client.py         `labkit serve client`: one request, per-token timestamps to JSONL
    lifecycle.py      `labkit serve lifecycle`: cancel, overload, slow consumer and shutdown against its own servers
    packages.py       the serve extra's packages, checked before a command starts
    command.py        the Typer sub-app

fastapi / uvicorn / prometheus-client / httpx / pyzmq / msgpack are the optional `serve` extra; the command
turns their absence into a one-line error. docs/serving.md explains the design and its measurements.
"""

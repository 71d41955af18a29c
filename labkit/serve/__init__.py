"""`labkit serve`: an OpenAI-shaped HTTP service; the engine steps in a process of its own.

    core.py           the engine-core process: owns the LLM, steps it, sends each step's outputs at once
    engine_client.py  the frontend's handle on it: spawn, submit/abort, route outputs to request streams
    protocol.py       the OpenAI wire format: bodies, validation against the engine's limits, responses
    detokenize.py     incremental detokenisation (O(1) per token)
    metrics.py        Prometheus families named as vLLM's
    http.py           the FastAPI routes (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)
    server.py         uvicorn with drain-then-exit on SIGTERM/SIGINT, deadlines on slow senders; exit 1 when the
                      engine dies
    client.py         `labkit serve client`: one request, per-token timestamps to JSONL
    command.py        the Typer sub-app

fastapi / uvicorn / prometheus-client / httpx / pyzmq / msgpack are the optional `serve` extra; the command
turns their absence into a one-line error. docs/serving.md explains the design and its measurements.
"""

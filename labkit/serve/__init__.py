"""`labkit serve`: an OpenAI-shaped HTTP service around one engine owned by one worker thread.

    worker.py   EngineWorker: owns the LLM, admits requests between steps, streams token events, cancels
    http.py     create_app(worker, model_name): FastAPI app (/v1/completions, /v1/chat/completions, ...)
    client.py   a streaming client that records per-token timestamps (ttft, itl) to JSONL
    command.py  the Typer sub-app: `labkit serve ...` and `labkit serve client ...`

fastapi / uvicorn / prometheus-client / httpx are the optional `serve` extra; only http.py, client.py
and the command need them, and the command turns their absence into a one-line error.
"""

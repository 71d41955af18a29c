"""What `labkit serve` and its subcommands need installed (the serve extra), checked before anything starts."""
from __future__ import annotations

from labkit.errors import LabkitError


def need_serve_packages() -> None:
    missing = []
    for mod in ("fastapi", "uvicorn", "prometheus_client", "zmq", "msgpack"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise LabkitError(f"labkit serve needs {', '.join(missing)}: pip install 'labkit[serve]'", 2)

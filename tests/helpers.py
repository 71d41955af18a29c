"""Small helpers shared by test modules."""
from __future__ import annotations

import pytest


def run_cli(args, capsys):
    """Run the real entry point in-process; return (exit code, stdout, stderr)."""
    from labkit import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(list(args))
    captured = capsys.readouterr()
    code = exited.value.code
    return (0 if code is None else code), captured.out, captured.err


def load_script(name: str, module_name: str | None = None):
    """scripts/<name>.py imported as a module (registered in sys.modules, which dataclasses in it need)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(module_name or name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def needs_sm90_tools() -> None:
    """Skip unless this Triton can compile for sm_90 and disassemble (its CUDA backend and cuobjdump)."""
    from pathlib import Path

    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this Triton has no CUDA tools")

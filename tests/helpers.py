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

"""The engine settings a command was given travel as one typed value (labkit/engine_args.py): from the command
line to the serve core's process, into a started server's command line and back, over a workload's settings."""
from __future__ import annotations

import pickle
import socket

import pytest

from labkit.engine_args import EngineArgs, check_settings
from labkit.errors import LabkitError

from .helpers import run_cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(monkeypatch, tiny_model):
    """Run `labkit serve ARGS` up to the point where it hands the engine settings to the server: what it hands."""
    import labkit.serve.server as server

    got = []

    async def fake_serve_async(model, engine_args, settings, **kw):
        got.append(engine_args)
        return 0

    monkeypatch.setattr(server, "serve_async", fake_serve_async)

    def serve(args, capsys):
        code, out, err = run_cli(["serve", "--model", tiny_model, "--port", str(_free_port()), *args], capsys)
        assert code == 0, err
        return got.pop()

    return serve


def test_serve_hands_the_core_one_typed_value_with_the_settings_given(served, capsys):
    args = served(["--device", "cpu", "--max-num-batched-tokens", "64", "--no-enforce-eager", "--scheduling-policy",
                   "mixed", "--tensor-parallel-size", "2"], capsys)
    assert isinstance(args, EngineArgs)
    assert args.kwargs() == {"max_num_batched_tokens": 64, "tensor_parallel_size": 2, "enforce_eager": False,
                             "device": "cpu", "scheduling_policy": "mixed"}
    assert pickle.loads(pickle.dumps(args)) == args   # (it crosses to the core's process as it is)


def test_a_started_servers_command_line_gives_it_the_same_settings(served, capsys, monkeypatch, tmp_path):
    from labkit.bench import load as L
    from labkit.bench.load_command import _start_server
    from labkit.options import Device

    started = []
    monkeypatch.setattr(L, "SpawnedServer", lambda argv, log, timeout: started.append(argv))
    want = EngineArgs(max_num_seqs=3, max_model_len=256, async_scheduling=False, enforce_eager=True,
                      kv_cache_dtype="fp8", scheduling_policy="balanced", tensor_parallel_size=1)

    class Quiet:
        def print(self, *a, **k):
            pass

    _start_server(tmp_path, Device.cpu, None, 4, want, tmp_path / "log", 1.0, Quiet())
    argv = [a for a in started[0]]
    i = argv.index("--model")
    del argv[i:i + 2]     # (the fixture gives its own model and port)
    assert served(argv, capsys) == EngineArgs(**want.kwargs(), device="cpu")


def test_settings_given_override_a_files_and_unknown_or_bad_ones_are_refused():
    assert EngineArgs(max_num_seqs=4).over({"max_num_seqs": 8, "max_model_len": 64}) == {"max_num_seqs": 4,
                                                                                         "max_model_len": 64}
    assert EngineArgs(enforce_eager=False, max_num_seqs=2).flags() == ["--max-num-seqs", "2", "--no-enforce-eager"]

    def fail(where, why):
        raise LabkitError(f"{where}: {why}")

    assert check_settings({"max_num_seqs": 2, "scheduling_policy": "mixed"}, fail) == {"max_num_seqs": 2,
                                                                                       "scheduling_policy": "mixed"}
    for bad, where in (({"budget": 2}, "engine: unknown key 'budget'"), ({"max_num_seqs": "2"}, "engine.max_num_seqs"),
                       ({"scheduling_policy": "fifo"}, "engine.scheduling_policy"),
                       ({"kvcache_memory_bytes": 0}, "engine.kvcache_memory_bytes")):
        with pytest.raises(LabkitError, match=where):
            check_settings(bad, fail)

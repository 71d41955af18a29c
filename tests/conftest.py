"""Shared fixtures: one tiny fake Qwen3 checkpoint per test session, and a Transformers reference."""
from __future__ import annotations

import os

import pytest
import torch

# pytest-xdist runs one worker per core: each worker (and every process it starts, through OMP_NUM_THREADS)
# gets its share of the cores. Oversubscribed OpenMP threads spin against each other and made some tests 7x
# slower than alone.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
os.environ["OMP_NUM_THREADS"] = str(_THREADS)
torch.set_num_threads(_THREADS)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from labkit.fake_model import make_fake_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    make_fake_model("tiny", out, seed=0)
    return str(out)


@pytest.fixture(scope="session")
def hf_model(tiny_model):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="session")
def hf_logits(hf_model):
    """Last-position logits of a token list, recomputed from scratch (no cache)."""
    cache: dict[tuple, torch.Tensor] = {}

    @torch.no_grad()
    def logits(token_ids: list[int]) -> torch.Tensor:
        key = tuple(token_ids)
        if key not in cache:
            cache[key] = hf_model(torch.tensor([token_ids]), use_cache=False).logits[0, -1].float()
        return cache[key]

    return logits


# Without a GPU, Triton kernels run in Triton's interpreter; it must be chosen before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from engine.kernels.interpreter import patch_interpreter

    patch_interpreter()


def replay_graphs(monkeypatch, which: str) -> None:
    """Make the CPU engine launch steps as on a GPU with CUDA graphs, for the async path: "every" step
    replays a graph, or only "decodes" (decode-only plans; prefills and mixed steps run eagerly). On the CPU
    every step is eager, so async scheduling schedules nothing ahead without this."""
    from engine.executor import Executor

    rule = {"every": lambda self, plan: True,
            "decodes": lambda self, plan: plan.num_decodes == len(plan)}[which]
    monkeypatch.setattr(Executor, "replays_graph", rule)


@pytest.fixture(autouse=True)
def _kernels_stay_inside_their_tensors():
    """Every interpreted Triton launch of every test is checked for loads and stores outside its tensors
    (tests/kernel_bounds.py): on a GPU such an access faults or reads another allocation, where the interpreter
    reads host memory without complaint. LABKIT_TEST_BOUNDS=0 turns the check off (to time it)."""
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("LABKIT_TEST_BOUNDS", "1") == "0":
        yield
        return
    from tests.kernel_bounds import bounds_checked

    with bounds_checked():
        yield

"""Runs each step's plan on every rank of the engine, behind one interface.

Rank 0 is this process's ModelRunner. With tensor_parallel_size N > 1, ranks 1..N-1 are worker processes
(engine/tp_workers.py) whose runners get the same plan first and run the same ModelRunner.execute on
their shard; the collectives inside the model keep the ranks in step, and rank 0 (where the logits are
gathered) samples. Nothing here dispatches by name: a plan is a step, a RankQuery a question to each rank.
"""
from __future__ import annotations

from typing import Callable

from .batch_plan import BatchPlan
from .config import Config
from .device import resolve_device
from .runner import Launched, ModelRunner
from .tp_workers import TensorParallel


class Executor:
    def __init__(self, config: Config):
        # Workers first: they build their runners while rank 0 builds its own.
        self.tp = TensorParallel(config, resolve_device(config.device)) if config.tensor_parallel_size > 1 else None
        try:
            self.runner = ModelRunner(config)
            if self.runner.attention_backend == "flash_attn" and config.kvcache_block_size % 256:
                raise ValueError("kvcache_block_size: flash_attn needs a multiple of 256, "
                                 f"got {config.kvcache_block_size}")
            if self.tp is not None:
                self.tp.wait_ready()
        except BaseException as exc:  # Ctrl-C too: a half-started engine must not keep its workers
            tp = self.tp
            if tp is None or not isinstance(exc, Exception) or isinstance(exc, ValueError) or tp.broken is not None:
                if tp is not None:
                    tp.shutdown(graceful=False)
                raise
            raise tp.fail("building the model runner", exc) from exc

    def execute(self, plan: BatchPlan) -> Launched:
        """Queue one step on every rank; returns rank 0's handle on it (its ids arrive on the host later)."""
        if self.tp is None:
            return self.runner.execute(plan)
        return self.tp.execute(plan.for_workers(), lambda: self.runner.execute(plan))

    def replays_graph(self, plan: BatchPlan) -> bool:
        """Will the plan run as a CUDA graph replay (a launch of microseconds) rather than eagerly? Every rank
        decides the same way from the same plan."""
        return self.runner.graph_key(plan) is not None

    def per_rank(self, fn: Callable) -> list:
        """fn(runner) on every rank, rank 0 first (fn must be a module-level function: it travels by name)."""
        return [fn(self.runner)] + (self.tp.ask(fn) if self.tp is not None else [])

    @property
    def broken(self) -> bool:
        """The workers are gone (a dead rank, or the engine has exited): no step can run any more."""
        return self.tp is not None and (self.tp.broken is not None or self.tp.closed)

    def check_alive(self) -> None:
        """Raise RuntimeError (naming the rank and its exit code) if a tensor-parallel worker has died; a
        no-op without TP. Cheap (no message to the workers): a caller may poll it while idle."""
        if self.tp is not None:
            self.tp.check_alive()

    def shutdown(self) -> None:
        try:
            self.runner.exit()
        finally:
            if self.tp is not None:
                self.tp.shutdown()

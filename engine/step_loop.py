"""The engine's step loop, chosen once when the engine starts (LLMEngine.step() delegates to it).

SyncLoop is nano-vLLM's step: schedule, execute, commit, one after the other; the device waits while the host
commits a step and schedules the next.

OverlappedLoop is async scheduling (Config.async_scheduling, on by default on a device that samples on the
device): while a step runs, the next one is scheduled with the same scheduler and, when it replays a CUDA graph,
launched before this step's ids reach the host. Its decode rows whose last token this step samples read it on
the device (BatchPlan.from_previous), so the device never waits for the host. Every state is the one a
synchronous engine reaches (tests/test_async_scheduling.py), with two exceptions the commit handles: an EOS
learnt now stops its sequence and the row it already has in the next step is discarded (one wasted token), and
an abort between steps discards its row in the step already launched (engine/in_flight.py keeps what a
sequence's rows in flight take back). Its rules of when to plan ahead are one predicate, `run_ahead`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .step_result import StepFailed, StepResult


@dataclass(slots=True)
class Scheduled:
    """A step the scheduler planned: its number, its plan, the prefix-cache queries and hits its scheduling added."""
    n: int
    plan: object
    prefix: tuple[int, int]


@dataclass(slots=True)
class Launched:
    """A step on the device: what was scheduled, rank 0's handle on it, and the queues it left (read before the
    next step is scheduled, when one is scheduled before it commits; else at its commit)."""
    n: int
    plan: object
    handle: object
    prefix: tuple[int, int]
    queues: tuple[int, int, int] | None = None    # waiting, running, free blocks after it


class SyncLoop:
    """schedule, execute, commit: one step at a time."""

    overlapped = False

    def __init__(self, engine):
        # The engine's parts: its scheduler, executor, tracer events (or None), before_schedule hook and
        # async_stats are read through it, so a hook set after start-up is seen.
        self.engine = engine
        self.scheduler = engine.scheduler
        self.executor = engine.executor
        self.launches = 0      # steps scheduled (each one's number)
        self.step_count = 0    # steps committed (the number of the last one)

    def step(self) -> StepResult:
        return self.commit(self.launch(self.schedule()))

    @property
    def idle(self) -> bool:
        """Nothing on the device and no failure waiting to be raised."""
        return True

    def schedule(self) -> Scheduled:
        """The next step's plan; the engine's before_schedule hook runs first (requests it adds join the step)."""
        engine = self.engine
        if engine.before_schedule is not None:
            engine.before_schedule()
        n = self.launches + 1
        bm = self.scheduler.block_manager
        before = bm.prefix_queries, bm.prefix_hits
        if engine.events is not None:
            engine.events.scheduling(n)
        plan = self.scheduler.schedule()
        self.launches = n
        return Scheduled(n, plan, (bm.prefix_queries - before[0], bm.prefix_hits - before[1]))

    def launch(self, s: Scheduled) -> Launched:
        """Queue a scheduled step on every rank."""
        events = self.engine.events
        try:
            handle = self.executor.execute(s.plan)
        except Exception as exc:
            if events is not None:
                events.failed(s.n, s.plan)
            raise self.step_failed(s.n, s.plan, exc) from exc
        if events is not None:
            events.launched(s.n, s.plan, handle.inputs)
        return Launched(s.n, s.plan, handle, s.prefix)

    def commit(self, step: Launched) -> StepResult:
        """Wait for the step's sampled ids, fill them in (Scheduler.commit), and say what the step did."""
        try:
            sampled = step.handle.token_ids()
        except Exception as exc:
            raise self.step_failed(step.n, step.plan, exc) from exc
        plan = step.plan
        tokens, reasons = self.scheduler.commit(plan, sampled)
        if plan.from_previous is not None:  # the ids its decode rows read on the device are on the host now
            step.handle.inputs.input_ids = [seq.token_ids[p] for seq, p in zip(plan.seqs, plan.starts[:plan.num_decodes])] \
                + plan.input_ids[plan.num_decodes:]
        self.step_count = step.n
        if self.engine.events is not None:
            self.engine.events.committed(step.n, plan, tokens, sampled)
        return StepResult.of(step.n, plan, step.handle.inputs, tokens, reasons,
                             step.queues or self.queues(), self.scheduler.block_manager.num_blocks, step.prefix)

    def queues(self) -> tuple[int, int, int]:
        sched = self.scheduler
        return len(sched.waiting), len(sched.running), sched.block_manager.num_free_blocks

    def step_failed(self, n: int, plan, exc: Exception) -> StepFailed:
        """Take a failed step's sequences out (blocks back to the pool) and say whether the engine survives."""
        fatal = self.executor.broken
        seqs = [s for s in plan.seqs if not s.is_finished or s.finish_reason == "length"]
        if not fatal:
            for seq, samples in zip(plan.seqs, plan.samples):
                self.scheduler.fail(seq, samples)
        what = "the engine cannot continue" if fatal else f"its {len(seqs)} sequence(s) were aborted"
        return StepFailed(f"step {n} failed ({type(exc).__name__}: {exc}); {what}",
                          [s.seq_id for s in seqs], [s.request_id for s in seqs], fatal)

    def drain(self) -> None:
        """Commit what is still on the device (the engine is exiting)."""


class OverlappedLoop(SyncLoop):
    """Schedule (and, for a graph replay, launch) the next step while this one runs: see the module's docstring."""

    overlapped = True

    def __init__(self, engine):
        super().__init__(engine)
        self.queued: Launched | None = None          # the next step, already on the device
        self.failed: Exception | None = None         # a failure of the step planned ahead, raised by the next step()

    @property
    def idle(self) -> bool:
        return self.queued is None and self.failed is None

    def step(self) -> StepResult:
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed
        current = self.queued or self.launch(self.schedule())
        self.queued = None
        if not self.run_ahead(current):
            return self.commit(current)
        current.queues = self.queues()  # what it leaves, before the next step changes it
        ahead = self.schedule_ahead()
        if ahead is None or self.executor.replays_graph(ahead.plan):
            self.queued = ahead and self.launch_ahead(ahead)   # a graph replay: launched now
            result = self.commit(current)
        else:  # an eager step: its launch is host-bound (tens of ms), so it goes after this step's tokens are out
            try:
                result = self.commit(current)
            finally:
                self.queued = self.launch_ahead(ahead)
        self.engine.async_stats["launched_ahead"] += self.queued is not None
        return result

    def run_ahead(self, current: Launched) -> bool:
        """Plan the next step while `current` runs? Only when there is something to plan, `current` replays a CUDA
        graph (a few ms of device time, launched in microseconds: the host is idle meanwhile; an eager step's launch
        kept the host busy about as long as the device runs it, and requests arriving during it can join the very
        next step), and the next step is not a prefill alone (Scheduler.next_is_eager_prefill, the policy's hint:
        planned now, it would leave out the requests that arrive while `current` runs)."""
        sched = self.scheduler
        return (not sched.is_finished() and self.executor.replays_graph(current.plan)
                and not sched.next_is_eager_prefill())

    def schedule_ahead(self) -> Scheduled | None:
        """The next step, planned while this one runs; a failure is raised by the next step() (this one commits)."""
        try:
            return self.schedule()
        except Exception as exc:  # (nothing can run)
            self.failed = exc
            return None

    def launch_ahead(self, s: Scheduled) -> Launched | None:
        try:
            return self.launch(s)
        except StepFailed as failed:
            if failed.fatal:  # (dead workers: no step can run, this one's result is moot)
                raise
            self.failed = failed
            return None

    def commit(self, step: Launched) -> StepResult:
        result = super().commit(step)
        # Rows computed for sequences that had meanwhile stopped on EOS or been aborted (their tokens dropped).
        self.engine.async_stats["wasted_rows"] += sum(t is None and ok for t, ok in zip(result.token_ids,
                                                                                         step.plan.samples))
        return result

    def drain(self) -> None:
        if self.queued is not None:  # a step still on the device: let it finish before the pool goes
            try:
                self.commit(self.queued)
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
            self.queued = None

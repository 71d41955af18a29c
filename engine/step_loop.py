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

import dataclasses
from dataclasses import dataclass

from .scheduler_snapshot import SchedulerSnapshot
from .step_result import StepFailed, StepResult


@dataclass(slots=True)
class Scheduled:
    """A step the scheduler planned: its number, its plan, the prefix-cache queries and hits its scheduling added."""
    n: int
    plan: object
    prefix: tuple[int, int]


@dataclass(slots=True)
class Launched:
    """A step on the device: what was scheduled, rank 0's handle on it, and what it left of the scheduler's queues
    and pool (read before the next step is scheduled, when one is scheduled before it commits; else at its
    commit)."""
    n: int
    plan: object
    handle: object
    prefix: tuple[int, int]
    after: SchedulerSnapshot | None = None


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
        # The ids the last committed step sampled: what the device read for a decode row of the next step whose
        # token it did not know when that step was planned (BatchPlan.from_previous).
        self.last_sampled: list[int] | None = None

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
        before = self.scheduler.snapshot()
        if engine.events is not None:
            engine.events.scheduling(n, before)
        plan = self.scheduler.schedule()
        self.launches = n
        after = self.scheduler.snapshot()
        return Scheduled(n, plan, (after.prefix_queries - before.prefix_queries,
                                   after.prefix_hits - before.prefix_hits))

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
            self.last_sampled = None
            raise self.step_failed(step.n, step.plan, exc) from exc
        plan = step.plan
        tokens, reasons = self.scheduler.commit(plan, sampled)
        inputs = step.handle.inputs
        if plan.from_previous is not None:  # the ids its decode rows read on the device are on the host now
            inputs = dataclasses.replace(inputs, input_ids=self.read_on_device(plan))
        self.last_sampled = sampled
        self.step_count = step.n
        if self.engine.events is not None:
            self.engine.events.committed(step.n, plan, tokens, sampled)
        return StepResult.of(step.n, plan, inputs, tokens, reasons, step.after or self.scheduler.snapshot(),
                             step.prefix)

    def read_on_device(self, plan) -> list[int]:
        """The plan's input ids with the ones its decode rows read on the device (the step before's samples)
        filled in; 0 where those samples never reached the host (that step failed)."""
        previous = self.last_sampled
        known = [previous[r] if r >= 0 and previous is not None else t
                 for r, t in zip(plan.from_previous, plan.input_ids)]
        return known + plan.input_ids[plan.num_decodes:]

    def step_failed(self, n: int, plan, exc: Exception) -> StepFailed:
        """Take a failed step's sequences out (blocks back to the pool) and say whether the engine survives."""
        fatal = self.executor.broken
        seq_ids, request_ids = self.scheduler.fail_step(plan, undo=not fatal)
        what = "the engine cannot continue" if fatal else f"its {len(seq_ids)} sequence(s) were aborted"
        return StepFailed(f"step {n} failed ({type(exc).__name__}: {exc}); {what}", seq_ids, request_ids, fatal)

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
        current.after = self.scheduler.snapshot()  # what it leaves, before the next step changes it
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

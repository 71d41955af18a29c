"""Run a case through the real engine with a JSONL tracer attached, honouring `after` dependencies."""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.errors import LabkitError
from labkit.trace.cases import Case, build_prompt_ids
from labkit.trace.validate import ENGINE_DIFFERS


@dataclass
class TraceRun:
    events: list[dict]
    log_path: Path
    wall_s: float
    device: str
    num_kvcache_blocks: int
    engine_kwargs: dict


def engine_changes() -> tuple[bool | None, str]:
    """Whether the engine that runs differs from its checkout's HEAD (a patch applied, an edit), and how.

    (True, "engine/ differs from HEAD: runner.py") / (False, "engine/ is HEAD's") / (None, why unknown).
    The engine is the imported `engine` package; git answers for its folder (tracked changes and new
    files). An installed copy or a tree without git has no HEAD to compare with: None, unknown."""
    import engine

    folder = Path(engine.__file__).resolve().parent
    try:
        done = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=normal",
                               "--", "."], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None, f"git is not available to compare {folder} with a commit"
    if done.returncode != 0:
        return None, f"{folder} is not in a git checkout"
    # (Bytecode is not a change: a checkout without a .gitignore shows engine/__pycache__/ as untracked.)
    paths = [line[3:].strip().rstrip("/") for line in done.stdout.splitlines() if line.strip()]
    files = sorted({p.rsplit("/", 1)[-1] for p in paths
                    if "__pycache__" not in p.split("/") and not p.endswith(".pyc")})
    if files:
        more = f" and {len(files) - 5} more" if len(files) > 5 else ""
        return True, f"{ENGINE_DIFFERS}: {', '.join(files[:5])}{more}"
    return False, "engine/ is HEAD's"


def engine_kwargs(case: Case, overrides: dict, device: str) -> dict:
    kwargs = {"enforce_eager": True}
    kwargs.update(case.engine)
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    kwargs.setdefault("device", device)
    if device != "auto":
        kwargs["device"] = device
    return kwargs


def run_case(case: Case, model_dir: Path, log_path: Path, *, overrides: dict | None = None, device: str = "auto",
             shapes: bool = False, run_id: str | None = None, tensor_parallel_size: int | None = None,
             context: dict | None = None) -> TraceRun:
    """Run `case`; `context` ({expect_changes, why_changes}: how the run is to be judged) goes into the log as a
    trace_context event, so a replay (`labkit trace check`, `labkit report verify`) judges it the same way."""
    from engine import LLM, SamplingParams
    from engine.trace import JsonlTracer

    overrides = dict(overrides or {})
    if tensor_parallel_size is not None:
        overrides["tensor_parallel_size"] = tensor_parallel_size
    kwargs = engine_kwargs(case, overrides, device)
    tracer = JsonlTracer(log_path, run=run_id, keep=True)
    tracer.shapes = shapes
    t0 = time.perf_counter()
    try:
        llm = LLM(str(model_dir), tracer=tracer, **kwargs)
    except Exception:
        tracer.close()
        raise
    try:
        if context is not None:
            tracer.step = None
            tracer.emit("trace_context", **context)
        vocab = llm.config.hf_config.vocab_size
        prompts = build_prompt_ids(case, vocab, tokenize=llm.tokenizer.encode)
        params = {r.id: SamplingParams(**r.sampling_kwargs()) for r in case.requests}
        seq_ids: dict[str, int] = {}
        pending = list(case.requests)

        def submit_ready():
            # `after` means: once the engine has finished that request, i.e. will schedule it no more. With
            # async scheduling that is known before its last step's tokens are (a length stop is decided when
            # that step is scheduled), and the engine schedules the next step inside step(): submitted from
            # its before_schedule hook, the new request joins the step a synchronous engine gives it.
            for r in list(pending):
                if r.after is None or r.after in seq_ids and llm.get_sequence(seq_ids[r.after]).is_finished:
                    seq_ids[r.id] = llm.add_request(prompts[r.id], params[r.id], request_id=r.id)
                    pending.remove(r)

        submit_ready()
        llm.before_schedule = submit_ready
        # A correct engine computes at least one token a step; ten times the case's tokens leaves room for
        # preemptions redoing work, and a step count past it is an engine that no longer makes progress.
        max_steps = 10 * sum(len(prompts[r.id]) + r.max_tokens for r in case.requests) + 100
        while not llm.is_finished() or pending:
            if llm.is_finished():
                raise LabkitError(f"case {case.name}: requests {[r.id for r in pending]} wait on requests that "
                                  "never finish")
            try:
                llm.step()
            except Exception as exc:  # noqa: BLE001 - an engine failure is a finding of the trace
                # Into the log (the validator fails engine.raised at this step; `trace check` sees it
                # too), and the steps before it are still judged.
                tracer.step = llm.step_count + 1  # the step that failed: the one after the last committed
                tracer.emit("engine_error", error=type(exc).__name__, message=" ".join(str(exc).split()))
                break
            submit_ready()
            if llm.step_count >= max_steps:
                tracer.emit("engine_error", error="NoProgress",
                            message=f"still running after {max_steps} steps (the case has "
                                    f"{max_steps // 10 - 10} tokens in all)")
                break
    finally:
        llm.exit()
    return TraceRun(tracer.events, Path(log_path), time.perf_counter() - t0, str(llm.device),
                    llm.config.num_kvcache_blocks, kwargs)

"""The engine loop: requests in, Sequences through Scheduler/BlockManager, Runner, sampler, postprocess."""
from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import os
import platform
import time
import weakref
from itertools import count

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from .config import Config
from .device import resolve_device
from .request_limits import RequestLimits
from .runner import ModelRunner
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence
from .step_result import StepFailed, StepResult
from .tp_workers import TensorParallel, rank_memory, reset_rank_memory

_CONFIG_FIELDS = {f.name for f in dataclasses.fields(Config)} - {"model", "hf_config", "eos"}


def _exit_engine(ref) -> None:
    engine = ref()
    if engine is not None:
        engine.exit()


class LLMEngine:
    def __init__(self, model: str | os.PathLike, **kwargs):
        unknown = sorted(set(kwargs) - _CONFIG_FIELDS)
        if unknown:
            raise ValueError(f"{unknown[0]}: not an engine argument (known: {', '.join(sorted(_CONFIG_FIELDS))})")
        self.config = config = Config(os.fspath(model) if isinstance(model, os.PathLike) else model, **kwargs)
        self.tracer = config.tracer
        t0 = time.perf_counter()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(config.model, use_fast=True)
        except Exception as e:
            raise ValueError(f"model: cannot load the tokenizer in {config.model}: {e}") from None
        if config.eos == -1 and self.tokenizer.eos_token_id is not None:
            config.eos = self.tokenizer.eos_token_id
        # Tensor parallel: ranks 1..N-1 are worker processes; this process is rank 0.
        self._tp = TensorParallel(config, resolve_device(config.device)) if config.tensor_parallel_size > 1 else None
        try:
            self.model_runner = ModelRunner(config)
            if self.model_runner.attention_backend == "flash_attn" and config.kvcache_block_size % 256:
                raise ValueError("kvcache_block_size: flash_attn needs a multiple of 256, "
                                 f"got {config.kvcache_block_size}")
            if self._tp is not None:
                self._tp.wait_ready()
        except BaseException as exc:  # Ctrl-C too: a half-started engine must not keep its workers
            if self._tp is None or not isinstance(exc, Exception) or isinstance(exc, ValueError) \
                    or self._tp.broken is not None:
                if self._tp is not None:
                    self._tp.shutdown(graceful=False)
                raise
            raise self._tp.fail("building the model runner", exc) from exc
        self.scheduler = Scheduler(config)
        self._limits = self.limits
        self.init_seconds = time.perf_counter() - t0
        self._seq_ids = count()
        self._seqs: dict[int, Sequence] = {}
        self.step_count = 0
        # Async scheduling (engine/scheduler.py plan_next_decode); not while model_shape hooks trace the forward
        # pass (the planned step's hooks would fire inside the step before it).
        self._async = config.async_scheduling and not getattr(self.tracer, "shapes", False)
        self._ahead = None
        self.async_steps = {"adopted": 0, "discarded": 0}  # planned steps kept / thrown away
        self._t_start = time.perf_counter()
        self._closed = False
        # exit() at interpreter exit, as nano does, through a weak reference (an engine that is dropped
        # without exit() is not kept alive); its workers go when it is collected.
        self._atexit = functools.partial(_exit_engine, weakref.ref(self))
        atexit.register(self._atexit)
        if self._tp is not None:
            weakref.finalize(self, self._tp.shutdown)
        if self.tracer is not None:
            self.tracer.emit("run_start", **self._run_start_fields())
            if getattr(self.tracer, "shapes", False):
                from .model_shapes import register_shape_hooks

                register_shape_hooks(self.model_runner.model, self.tracer)

    # --- what this engine resolved its settings to (rank 0's; every rank resolves the same) -------------
    @property
    def device(self) -> torch.device:
        return self.model_runner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model_runner.dtype

    @property
    def attention_backend(self) -> str:
        """The backend in use ("auto" resolved): "flash_attn", "triton" or "torch"."""
        return self.model_runner.attention_backend

    @property
    def execution(self) -> str:
        """How decode steps run: "graph" when CUDA graphs were captured, else "eager"."""
        return self.model_runner.execution

    @property
    def graph_capture_seconds(self) -> float | None:
        """Time spent capturing CUDA graphs at start-up (part of init_seconds); None when none were captured."""
        return self.model_runner.graph_capture_seconds

    def read_kv(self, slots: list[int]) -> torch.Tensor:
        """K and V as written in the KV pool at the given slots: [2, layers, len(slots), kv_heads, head_dim]
        on the engine's device (rank 0's heads under tensor parallel)."""
        from .kv_layout import read_slots

        pool = self.model_runner.kv_cache
        return read_slots(pool, torch.tensor(slots, dtype=torch.long, device=pool.device))

    # --- requests -------------------------------------------------------------------------------
    @property
    def limits(self) -> RequestLimits:
        """What a request may ask of this engine (a server validates with the same object)."""
        cfg = self.config
        return RequestLimits(max_model_len=cfg.max_model_len, vocab_size=cfg.hf_config.vocab_size,
                             block_size=cfg.kvcache_block_size, num_blocks=cfg.num_kvcache_blocks)

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt: empty string")
            return self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)):
            raise ValueError(f"prompt: expected a non-empty string or list of token ids, got {type(prompt).__name__}")
        return self._limits.check_token_ids(prompt)

    def _check_fits(self, token_ids: list[int], sp: SamplingParams) -> None:
        self._limits.check(token_ids, sp)

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None) -> int:
        sp = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(sp, SamplingParams):
            raise ValueError(f"sampling_params: expected SamplingParams, got {type(sp).__name__}")
        token_ids = self._encode(prompt)
        self._check_fits(token_ids, sp)
        cfg = self.config
        seq = Sequence(token_ids, sp, next(self._seq_ids), cfg.kvcache_block_size, request_id)
        self._seqs[seq.seq_id] = seq
        self.scheduler.add(seq)
        if self.tracer is not None:
            self.tracer.step = None
            self.tracer.emit("request_added", seq_id=seq.seq_id, request_id=seq.request_id,
                             prompt_len=len(token_ids), max_tokens=sp.max_tokens, ignore_eos=sp.ignore_eos,
                             temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p,
                             prompt_token_ids=token_ids)
        return seq.seq_id

    def is_finished(self) -> bool:
        return self.scheduler.is_finished()

    def stats(self) -> dict:
        """Queue and pool figures between steps (a StepResult carries the same after each step)."""
        sched = self.scheduler
        bm = sched.block_manager
        return {"waiting": len(sched.waiting), "running": len(sched.running), "free_blocks": bm.num_free_blocks,
                "num_blocks": bm.num_blocks}

    def abort(self, seq_id: int) -> bool:
        """Cancel a request between steps; its KV blocks return to the pool. False if already finished."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"seq_id: no request {seq_id!r} in this engine")
        done = self.scheduler.abort(seq)
        if done and self.tracer is not None:
            self.tracer.step = None
            self.tracer.emit("aborted", seq_id=seq.seq_id, request_id=seq.request_id,
                             num_completion_tokens=seq.num_completion_tokens,
                             free_blocks=self.scheduler.block_manager.num_free_blocks)
        return done

    def get_sequence(self, seq_id: int) -> Sequence:
        return self._seqs[seq_id]

    def forget(self, seq_id: int) -> None:
        """Drop a finished request's record (a long-running server calls this once it has delivered it)."""
        seq = self._seqs.get(seq_id)
        if seq is not None and not seq.is_finished:
            raise ValueError(f"seq_id: request {seq_id} is still running; abort() it first")
        self._seqs.pop(seq_id, None)

    # --- the step -------------------------------------------------------------------------------
    def step(self, choose_tokens=None) -> StepResult:
        """One engine step: schedule, run the model, sample, postprocess. Returns what it did (StepResult).

        `choose_tokens(seqs, logits) -> list[int]` replaces the sampler (teacher forcing, logits capture);
        `logits` holds each scheduled sequence's last-position row, chunk candidates included.
        An exception after scheduling takes the step's sequences out of the engine and raises StepFailed."""
        self.step_count += 1
        tracer = self.tracer
        sched = self.scheduler
        bm = sched.block_manager
        if tracer is not None:
            tracer.step = self.step_count
            tracer.emit("before_schedule", waiting=[s.seq_id for s in sched.waiting],
                        running=[s.seq_id for s in sched.running], free_blocks=bm.num_free_blocks)
        queries, hits = bm.prefix_queries, bm.prefix_hits
        seqs, is_prefill = sched.schedule()
        runner = self.model_runner
        # The tracer sees the runner's inputs before the forward pass (its model_shape hooks fire during it).
        on_inputs = None if tracer is None else functools.partial(self._trace_schedule, seqs, is_prefill)
        ahead, self._ahead = self._ahead, None
        try:
            # Async scheduling: the step planned during the last one may already be on the device (on every
            # rank: the workers ran their part of it then).
            if ahead is not None and choose_tokens is None and ahead.matches(seqs, is_prefill):
                launched = runner.adopt(ahead, seqs)
                self.async_steps["adopted"] += 1
                if on_inputs is not None:
                    on_inputs(launched.inputs)
            else:
                if ahead is not None:
                    runner.discard(ahead)
                    self.async_steps["discarded"] += 1
                launched = self._on_all_ranks("run", (seqs, is_prefill),
                                              lambda: runner.launch(seqs, is_prefill, on_inputs, choose_tokens))
            if self._async and choose_tokens is None:
                # Queue the next step before waiting for this one's ids, so the device has work while the
                # host postprocesses and schedules.
                plan = sched.plan_next_decode(seqs)
                if plan is not None:
                    planned = runner.planned_step(plan, launched)
                    self._ahead = self._on_all_ranks("launch_planned", planned,
                                                     lambda: runner.launch_ahead(plan, planned, launched))
            inputs = launched.inputs
            token_ids = launched.token_ids()
        except Exception as exc:
            if self._ahead is not None:
                runner.discard(self._ahead)
                self._ahead = None
            raise self._step_failed(seqs, exc) from exc
        if tracer is not None:
            tracer.emit("sampled", tokens=[{"seq_id": s.seq_id, "token_id": t} for s, t in zip(seqs, token_ids)])
        held = {s.seq_id: list(s.block_table) for s in seqs} if tracer is not None else None
        computed = [s.num_scheduled_tokens for s in seqs]
        accepted = sched.postprocess(seqs, token_ids)
        if tracer is not None:
            self._trace_postprocess(seqs, token_ids, accepted, held)
        return StepResult(
            step=self.step_count, phase="prefill" if is_prefill else "decode",
            seq_ids=[s.seq_id for s in seqs], request_ids=[s.request_id for s in seqs],
            num_scheduled_tokens=computed, num_cached_tokens=[s.num_cached_tokens for s in seqs],
            num_tokens=[s.num_tokens for s in seqs],
            token_ids=[int(t) if acc else None for t, acc in zip(token_ids, accepted)],
            finish_reasons=[s.finish_reason for s in seqs], preempted=[s.seq_id for s in sched.preempted],
            inputs=inputs, num_waiting=len(sched.waiting), num_running=len(sched.running),
            num_free_blocks=bm.num_free_blocks, num_blocks=bm.num_blocks,
            prefix_cache_queries=bm.prefix_queries - queries, prefix_cache_hits=bm.prefix_hits - hits)

    def _step_failed(self, seqs, exc: Exception) -> StepFailed:
        """Take a failed step's sequences out (blocks back to the pool) and say whether the engine survives."""
        fatal = self._tp is not None and (self._tp.broken is not None or self._tp.closed)
        for seq in seqs:
            seq.num_scheduled_tokens = 0
            if not fatal:
                self.scheduler.abort(seq)
                seq.finish_reason = "error"
        what = "the engine cannot continue" if fatal else f"its {len(seqs)} sequence(s) were aborted"
        return StepFailed(f"step {self.step_count} failed ({type(exc).__name__}: {exc}); {what}",
                          [s.seq_id for s in seqs], [s.request_id for s in seqs], fatal)

    def _on_all_ranks(self, method: str, args: tuple, local):
        """`local()` here; with tensor parallel, `method(*args)` on every worker's runner first."""
        if self._tp is None:
            return local()
        return self._tp.call(method, args, local)

    # --- per-rank facts (tensor parallel workers answer over the control channel) --------------------
    def peak_memory_per_rank(self) -> list[dict]:
        """Each rank's peak memory: {rank, device, peak_bytes, peak_reserved_bytes, source}, rank 0 first."""
        mine = rank_memory(self.model_runner)
        return [mine] + (self._tp.call("peak_memory", reply=True) if self._tp is not None else [])

    def reset_peak_memory(self) -> None:
        """Reset every rank's peak-memory counter (CUDA allocator; a no-op on the CPU)."""
        reset_rank_memory(self.model_runner)
        if self._tp is not None:
            self._tp.call("reset_peak_memory", reply=True)

    def shapes_per_rank(self) -> list[dict]:
        """What each rank really allocated: parameter shapes (layer 0 + the rest) and the KV pool."""
        from .model_shapes import rank_shapes

        mine = rank_shapes(self.model_runner)
        return [mine] + (self._tp.call("shapes", reply=True) if self._tp is not None else [])

    def generate(self, prompts: list[str] | list[list[int]], sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[dict]:
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("prompts: expected a non-empty list of strings or of token-id lists")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"sampling_params: {len(sampling_params)} given for {len(prompts)} prompts")
            params = list(sampling_params)
        else:
            params = [sampling_params] * len(prompts)
        # Validate everything before queueing anything, so a bad prompt leaves the engine untouched.
        encoded = [self._encode(p) for p in prompts]
        for p in params:
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params: expected SamplingParams, got {type(p).__name__}")
        for ids, sp in zip(encoded, params):
            self._check_fits(ids, sp)
        seq_ids = [self.add_request(ids, sp) for ids, sp in zip(encoded, params)]
        pbar = tqdm(total=len(prompts), desc="Generating", dynamic_ncols=True, disable=not use_tqdm)
        results: dict[int, list[int]] = {}
        prefill_tps = decode_tps = 0.0
        while not self.is_finished():
            t = time.perf_counter()
            result = self.step()
            dt = max(time.perf_counter() - t, 1e-9)
            if result.phase == "prefill":
                prefill_tps = result.num_computed_tokens / dt
            else:
                decode_tps = result.batch_size / dt
            if use_tqdm:
                pbar.set_postfix({"Prefill": f"{int(prefill_tps)}tok/s", "Decode": f"{int(decode_tps)}tok/s"})
            for seq_id, reason in zip(result.seq_ids, result.finish_reasons):
                if reason is not None:
                    results[seq_id] = self._seqs[seq_id].completion_token_ids
                    pbar.update(1)
        pbar.close()
        outs = []
        for seq_id in seq_ids:
            token_ids = results[seq_id]
            seq = self._seqs.pop(seq_id)
            outs.append({"text": self.tokenizer.decode(token_ids), "token_ids": token_ids,
                         "finish_reason": seq.finish_reason})
        return outs

    def exit(self):
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        if self.tracer is not None:
            self.tracer.step = None
            self.tracer.emit("run_end", steps=self.step_count, wall_s=time.perf_counter() - self._t_start)
            self.tracer.close()
        try:
            self.model_runner.exit()
        finally:
            if self._tp is not None:
                self._tp.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.exit()

    # --- tracing (only reached when a tracer is set) --------------------------------------------
    def _run_start_fields(self) -> dict:
        cfg = self.config
        config = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("tracer", "hf_config")}
        with open(os.path.join(cfg.model, "config.json"), "rb") as f:
            config_sha = hashlib.sha256(f.read()).hexdigest()
        import transformers

        return {
            "config": config,
            "model": {"path": os.path.abspath(cfg.model), "config_sha256": config_sha},
            "device": str(self.device),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "tp_rank": self.model_runner.rank,
            "tp_size": cfg.tensor_parallel_size,
            "kv_bytes_per_token": self.model_runner.kv_block_bytes // cfg.kvcache_block_size,  # this rank's
            "block_size": cfg.kvcache_block_size,
            "num_kvcache_blocks": cfg.num_kvcache_blocks,
            "attention_backend": self.model_runner.attention_backend,
            "dtype": str(self.model_runner.dtype).replace("torch.", ""),
        }

    def _trace_schedule(self, seqs, is_prefill, inputs):
        tracer = self.tracer
        for seq in self.scheduler.preempted:
            tracer.emit("preempted", seq_id=seq.seq_id, request_id=seq.request_id)
        tracer.emit("scheduled", phase="prefill" if is_prefill else "decode", seqs=[
            {"seq_id": s.seq_id, "request_id": s.request_id, "num_tokens": s.num_tokens,
             "num_cached_tokens": s.num_cached_tokens, "num_scheduled_tokens": s.num_scheduled_tokens,
             "block_table": list(s.block_table)} for s in seqs])
        # The event keeps nano-vLLM's rule: a prefill has block tables only when it reads a cached prefix (the
        # triton backend is handed them in every prefill).
        tables = inputs.block_tables
        if is_prefill and inputs.cu_seqlens_k[-1] == inputs.cu_seqlens_q[-1]:
            tables = None
        tracer.emit("gpu_inputs", num_input_ids=len(inputs.input_ids), positions=inputs.positions,
                    slot_mapping=inputs.slot_mapping, cu_seqlens_q=inputs.cu_seqlens_q,
                    cu_seqlens_k=inputs.cu_seqlens_k, max_seqlen_q=inputs.max_seqlen_q,
                    max_seqlen_k=inputs.max_seqlen_k, context_lens=inputs.context_lens,
                    block_tables=tables, execution=inputs.execution, graph_batch=inputs.graph_batch)

    def _trace_postprocess(self, seqs, token_ids, accepted, held):
        bm = self.scheduler.block_manager
        entries = []
        for s, t, acc in zip(seqs, token_ids, accepted):
            entry = {"seq_id": s.seq_id, "request_id": s.request_id, "num_tokens": s.num_tokens,
                     "num_cached_tokens": s.num_cached_tokens, "num_completion_tokens": s.num_completion_tokens,
                     "status": s.status.name, "block_table": list(s.block_table), "accepted": acc, "token_id": t,
                     "ref_counts": bm.ref_counts(s), "finish_reason": s.finish_reason}
            if s.is_finished:
                # The blocks it just let go of, and who still holds them (0: free, KV and hash kept).
                entry["released_blocks"] = held[s.seq_id]
                entry["released_ref_counts"] = [bm.blocks[b].ref_count for b in held[s.seq_id]]
            entries.append(entry)
        self.tracer.emit("after_postprocess", seqs=entries, free_blocks=bm.num_free_blocks)


class LLM(LLMEngine):
    pass

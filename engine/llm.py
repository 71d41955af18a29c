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
from importlib.metadata import PackageNotFoundError, version as _package_version
from itertools import count
from typing import Callable

import torch
from tqdm.auto import tqdm

from .config import Config
from .executor import Executor
from .request_limits import RequestLimits
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence
from .step_events import StepEvents
from .step_loop import OverlappedLoop, SyncLoop
from .step_result import StepResult
from .tokenizer import Tokenizer
from .tp_workers import rank_memory, reset_rank_memory

_CONFIG_FIELDS = {f.name for f in dataclasses.fields(Config)} - {"model", "hf_config", "eos"}


def _exit_engine(ref) -> None:
    engine = ref()
    if engine is not None:
        engine.exit()


def _version(package: str) -> str | None:
    """A package's version without importing it (transformers takes seconds to import)."""
    try:
        return _package_version(package)
    except PackageNotFoundError:
        return None


class LLMEngine:
    def __init__(self, model: str | os.PathLike, **kwargs):
        unknown = sorted(set(kwargs) - _CONFIG_FIELDS)
        if unknown:
            raise ValueError(f"{unknown[0]}: not an engine argument (known: {', '.join(sorted(_CONFIG_FIELDS))})")
        self.config = config = Config(os.fspath(model) if isinstance(model, os.PathLike) else model, **kwargs)
        self.tracer = config.tracer
        t0 = time.perf_counter()
        try:
            self.tokenizer = Tokenizer(config.model)
        except Exception as e:
            raise ValueError(f"model: cannot load the tokenizer in {config.model}: {e}") from None
        if config.eos == -1 and self.tokenizer.eos_token_id is not None:
            config.eos = self.tokenizer.eos_token_id
        t_tokenizer = time.perf_counter() - t0
        self.executor = Executor(config)
        self.model_runner = self.executor.runner
        self.scheduler = Scheduler(config)
        self._limits = self.limits
        self.init_seconds = time.perf_counter() - t0
        # Where init_seconds went (rank 0's phases; the rest is waiting for tensor-parallel workers).
        self.startup_seconds = {"tokenizer": t_tokenizer, **self.model_runner.startup_seconds}
        self.startup_seconds["other"] = max(0.0, self.init_seconds - sum(self.startup_seconds.values()))
        self._seq_ids = count()
        self._seqs: dict[int, Sequence] = {}
        # Async scheduling: steps launched while the step before them ran, and rows computed for sequences that
        # had meanwhile stopped on EOS or been aborted (their tokens dropped).
        self.async_stats = {"launched_ahead": 0, "wasted_rows": 0}
        # Called right before each step is scheduled (add_request and abort may be called from it): with async
        # scheduling the next step is scheduled inside step(), while this one runs, and requests that arrived
        # meanwhile join it only if they are added here.
        self.before_schedule: Callable[[], None] | None = None
        self.events = None
        self._loop = self._step_loop()
        self._t_start = time.perf_counter()
        self._closed = False
        # exit() at interpreter exit, as nano does, through a weak reference (an engine that is dropped
        # without exit() is not kept alive); its workers go when it is collected.
        self._atexit = functools.partial(_exit_engine, weakref.ref(self))
        atexit.register(self._atexit)
        if self.executor.tp is not None:
            weakref.finalize(self, self.executor.tp.shutdown)
        if self.tracer is not None:
            self.events = StepEvents(self.tracer, self.scheduler, self._seqs)
            self.events.emit_now("run_start", **self._run_start_fields())
            if getattr(self.tracer, "shapes", False):
                from .model_shapes import register_shape_hooks

                register_shape_hooks(self.model_runner.model, self.events)

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
        """K and V as attention reads them from the KV pool at the given slots: [2, layers, len(slots), kv_heads,
        head_dim] on the engine's device (rank 0's heads under tensor parallel); an FP8 pool's rows dequantised
        (e4m3 value x scale) in float32."""
        from .kv_layout import read_slots
        from .kv_quant import FP8

        runner = self.model_runner
        pool = runner.kv_cache
        rows = read_slots(pool, torch.tensor(slots, dtype=torch.long, device=pool.device), runner.v_transposed)
        if pool.dtype != FP8:
            return rows
        scales = torch.tensor([[a.k_scale for a in runner.attn_layers], [a.v_scale for a in runner.attn_layers]],
                              dtype=torch.float32, device=pool.device)
        return rows.float() * scales[:, :, None, None, None]

    # --- requests -------------------------------------------------------------------------------
    @property
    def limits(self) -> RequestLimits:
        """What a request may ask of this engine (a server validates with the same object)."""
        cfg = self.config
        return RequestLimits(max_model_len=cfg.max_model_len, vocab_size=cfg.hf_config.vocab_size,
                             block_size=cfg.kvcache_block_size, num_blocks=cfg.num_kvcache_blocks,
                             max_prompt_chars=cfg.max_model_len * self.tokenizer.max_chars_per_token)

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt: empty string")
            return self.tokenizer.encode(self._limits.check_text(prompt))
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
        if self.events is not None:
            self.events.emit_now("request_added", seq_id=seq.seq_id, request_id=seq.request_id,
                                 prompt_len=len(token_ids), max_tokens=sp.max_tokens, ignore_eos=sp.ignore_eos,
                                 temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, seed=sp.seed,
                                 prompt_token_ids=token_ids)
        return seq.seq_id

    def is_finished(self) -> bool:
        """Nothing waits, runs, or is still on the device."""
        return self.scheduler.is_finished() and self._loop.idle

    def stats(self) -> dict:
        """Queue and pool figures between steps (a StepResult carries the same after each step)."""
        now = self.scheduler.snapshot()
        return {"waiting": len(now.waiting_ids), "running": len(now.running_ids), "free_blocks": now.free_blocks,
                "num_blocks": now.num_blocks}

    def abort(self, seq_id: int) -> bool:
        """Cancel a request between steps; its KV blocks return to the pool. False if already finished.
        (A step already launched with a row for it computes that row; its token is dropped.)"""
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"seq_id: no request {seq_id!r} in this engine")
        done = self.scheduler.abort(seq)
        if done and self.events is not None:
            self.events.aborted(seq)
        return done

    def enable_kv_events(self) -> None:
        """Record every change to the prefix cache's set of block hashes from now on (take_kv_events reads them):
        what a prefix-aware router needs to mirror this engine's cache. Call it before the first request (a
        mirror starts from an empty cache)."""
        self.scheduler.record_kv_events()

    def take_kv_events(self) -> list[tuple]:
        """The prefix cache's changes since the last call, in order: ("stored", block hash, parent block hash or
        None, the block's token ids) when a hash becomes findable, ("removed", block hash) when it no longer is.
        Empty unless enable_kv_events was called."""
        return self.scheduler.take_kv_events()

    def get_sequence(self, seq_id: int) -> Sequence:
        return self._seqs[seq_id]

    def forget(self, seq_id: int) -> None:
        """Drop a finished request's record (a long-running server calls this once it has delivered it)."""
        seq = self._seqs.get(seq_id)
        if seq is not None and not seq.is_finished:
            raise ValueError(f"seq_id: request {seq_id} is still running; abort() it first")
        self._seqs.pop(seq_id, None)

    # --- the step -------------------------------------------------------------------------------
    def _step_loop(self) -> SyncLoop:
        """The step loop, chosen once: overlapped (async scheduling) unless the config turns it off, model_shape
        hooks trace the forward pass (they would fire inside the step before) or a host-side sampling strategy
        picks the tokens (teacher forcing: it needs each step's logits on the host before the next step)."""
        overlap = (self.config.async_scheduling and not getattr(self.tracer, "shapes", False)
                   and self.model_runner.sampling.on_device)
        return (OverlappedLoop if overlap else SyncLoop)(self)

    def step(self) -> StepResult:
        """One engine step: schedule, run the model, sample, commit; returns what it did (StepResult). The loop
        (engine/step_loop.py) may have launched this step during the call before, and may launch the next one
        now. An exception after scheduling takes the step's sequences out of the engine and raises StepFailed."""
        return self._loop.step()

    @property
    def step_count(self) -> int:
        """Steps committed (StepResult.step of the last one)."""
        return self._loop.step_count

    @property
    def sampling(self):
        """How each step's tokens are picked (engine/sampler.py): DeviceSampling, or a host-side strategy such
        as TeacherForcing (set it here; the engine then runs without async scheduling)."""
        return self.model_runner.sampling

    @sampling.setter
    def sampling(self, strategy) -> None:
        if not self._loop.idle:
            raise ValueError("sampling: set it between steps, with no step on the device")
        self.model_runner.sampling = strategy
        loop, self._loop = self._loop, self._step_loop()  # (the loop depends on where tokens are picked)
        self._loop.launches, self._loop.step_count = loop.launches, loop.step_count

    # --- per-rank facts (tensor parallel workers answer over the control channel) --------------------
    def peak_memory_per_rank(self) -> list[dict]:
        """Each rank's peak memory: {rank, device, peak_bytes, peak_reserved_bytes, source}, rank 0 first."""
        return self.executor.per_rank(rank_memory)

    def reset_peak_memory(self) -> None:
        """Reset every rank's peak-memory counter (CUDA allocator; a no-op on the CPU)."""
        self.executor.per_rank(reset_rank_memory)

    def shapes_per_rank(self) -> list[dict]:
        """What each rank really allocated: parameter shapes (layer 0 + the rest) and the KV pool."""
        from .model_shapes import rank_shapes

        return self.executor.per_rank(rank_shapes)

    def generate(self, prompts: list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
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
        t0 = time.perf_counter()
        computed = generated = 0
        while not self.is_finished():
            result = self.step()
            computed += result.num_computed_tokens
            generated += result.num_new_tokens
            if use_tqdm:
                # Rates since the start (a step's own time means little when the next one is already queued).
                dt = max(time.perf_counter() - t0, 1e-9)
                pbar.set_postfix({"Prefill": f"{int((computed - generated) / dt)}tok/s",
                                  "Decode": f"{int(generated / dt)}tok/s"})
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

    def check_alive(self) -> None:
        """Raise RuntimeError if a tensor-parallel worker has died (a no-op without TP). Cheap: a server may
        poll it while the engine idles, when no step would show the death."""
        self.executor.check_alive()

    def exit(self):
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        self._loop.drain()  # a step still on the device: let it finish before the pool goes
        if self.events is not None:
            self.events.emit_now("run_end", steps=self.step_count, wall_s=time.perf_counter() - self._t_start)
            self.tracer.close()
        self.executor.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.exit()

    # --- tracing (only reached when a tracer is set) --------------------------------------------
    def _run_start_fields(self) -> dict:
        cfg = self.config
        config = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
                  if f.name not in ("tracer", "hf_config")}
        with open(os.path.join(cfg.model, "config.json"), "rb") as f:
            config_sha = hashlib.sha256(f.read()).hexdigest()
        return {
            "config": config,
            "model": {"path": os.path.abspath(cfg.model), "config_sha256": config_sha},
            "device": str(self.device),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": _version("transformers")},
            "tp_rank": self.model_runner.rank,
            "async_scheduling": self._loop.overlapped,
            "tp_size": cfg.tensor_parallel_size,
            "kv_bytes_per_token": self.model_runner.kv_block_bytes // cfg.kvcache_block_size,  # this rank's
            "block_size": cfg.kvcache_block_size,
            "num_kvcache_blocks": cfg.num_kvcache_blocks,
            "attention_backend": self.model_runner.attention_backend,
            "dtype": str(self.model_runner.dtype).replace("torch.", ""),
            "kv_cache_dtype": str(self.model_runner.kv_dtype).replace("torch.", ""),
        }


class LLM(LLMEngine):
    pass

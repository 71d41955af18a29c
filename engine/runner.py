"""ModelRunner: owns the model and the paged KV pool, turns a scheduled batch into tensors, runs the
forward pass and samples. The only host sync per step is fetching the sampled ids."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from .config import Config
from .context import Context, reset_context, set_context
from .device import num_sms, resolve_device, resolve_dtype
from .distributed import all_reduce_min, broadcast_from_rank0, set_tp
from .kernel_choice import choose_kernels
from .kv_layout import pool_shape
from .layers.attention import Attention
from .loader import load_model
from .models.qwen3 import Qwen3ForCausalLM
from .profiling import phase
from .sampler import Sampler
from .sequence import Sequence
from .staging import Staging

# Decode contexts up to this many tokens run in the one-split graph of a small batch (capture_cudagraph).
SHORT_CONTEXT = 512
# A CPU KV pool takes at most this much memory unless num_kvcache_blocks / kvcache_memory_bytes say otherwise.
DEFAULT_CPU_KV_BYTES = 512 << 20


@dataclass
class StepInputs:
    """Host-side view of one step's model inputs (what the tracer records as gpu_inputs)."""
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    cu_seqlens_q: list[int] | None = None
    cu_seqlens_k: list[int] | None = None
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None
    context_lens: list[int] | None = None
    # Each sequence's blocks, rows padded with -1: in decode, in a prefill that reads a cached prefix, and in
    # every prefill for a backend that reads all keys through the pool (KernelChoice.prefill_block_tables).
    block_tables: list[list[int]] | None = None
    execution: str = "eager"
    graph_batch: int | None = None


@dataclass
class Launched:
    """A step queued on the device: its inputs, and (rank 0) its sampled ids on the device and on their way
    to the host, or the ids a choose_tokens hook picked."""
    inputs: StepInputs
    sampled: torch.Tensor | None = None
    fetch: object = None                      # staging.Fetch
    chosen: list[int] | None = None

    def token_ids(self) -> list[int] | None:
        """The step's ids on the host (waits for the device); None off rank 0."""
        if self.chosen is not None:
            return self.chosen
        return None if self.fetch is None else self.fetch.tolist()


@dataclass
class Ahead:
    """A planned step launched before its schedule was known (async scheduling)."""
    plan: list                                # Scheduler.plan_next_decode's rows
    launched: Launched
    rng: tuple                                # the sampler's state before it: restored on discard

    def matches(self, seqs: list, is_prefill: bool) -> bool:
        """Whether the scheduled step is exactly the planned one: same sequences in the same order, each
        with the planned length and block table (so the same positions, slots and graph bucket)."""
        plan = self.plan
        return (not is_prefill and len(seqs) == len(plan)
                and all(seq is row[0] and seq.num_tokens == row[1] and seq.block_table == row[2]
                        for seq, row in zip(seqs, plan)))


def _patch_ids(ids: torch.Tensor, patch, dst, src) -> None:
    """Write the previous step's sampled ids into this step's input ids, on the device."""
    sampled, n, _, _ = patch
    if n is not None:
        ids[:n].copy_(sampled[:n])
    else:
        ids.index_copy_(0, dst, sampled.index_select(0, src).to(ids.dtype))


def graph_input_views(buf: torch.Tensor, max_bs: int, max_blocks: int) -> dict[str, torch.Tensor]:
    """The decode graphs' inputs as views of one flat int32 buffer: [ids | positions | slots | context
    lengths | block tables], each of max_bs rows. The tables come last, so rows [:bs] of every input are
    covered by one prefix of the buffer (see fill_graph_inputs)."""
    return {
        "input_ids": buf[0:max_bs],
        "positions": buf[max_bs:2 * max_bs],
        "slot_mapping": buf[2 * max_bs:3 * max_bs],
        "context_lens": buf[3 * max_bs:4 * max_bs],
        "block_tables": buf[4 * max_bs:4 * max_bs + max_bs * max_blocks].view(max_bs, max_blocks),
    }


def fill_graph_inputs(a, inputs: StepInputs, max_bs: int, max_blocks: int) -> int:
    """Write one decode step into `a` (a numpy view of the host mirror, laid out as graph_input_views);
    return how many leading elements must reach the device. Padding rows up to the bucket read token 0 at
    position 0, write no KV (slot -1) and attend to nothing (context 0); table entries past a row's width
    and rows past the bucket are never read."""
    bs, bucket = len(inputs.input_ids), inputs.graph_batch
    a[0:bs] = inputs.input_ids
    a[bs:bucket] = 0  # the staging buffer is shared: padding rows must not keep another upload's bytes
    a[max_bs:max_bs + bs] = inputs.positions
    a[max_bs + bs:max_bs + bucket] = 0  # (as ids and positions, those index the embedding and RoPE tables)
    a[2 * max_bs:2 * max_bs + bs] = inputs.slot_mapping
    a[2 * max_bs + bs:2 * max_bs + bucket] = -1
    a[3 * max_bs:3 * max_bs + bs] = inputs.context_lens
    a[3 * max_bs + bs:3 * max_bs + bucket] = 0
    tables = inputs.block_tables
    a[4 * max_bs:4 * max_bs + bs * max_blocks].reshape(bs, max_blocks)[:, :len(tables[0])] = tables
    return 4 * max_bs + bs * max_blocks


@contextlib.contextmanager
def _default_dtype_device(dtype: torch.dtype, device: torch.device):
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            yield
    finally:
        torch.set_default_dtype(old_dtype)


class ModelRunner:
    def __init__(self, config: Config, rank: int = 0):
        self.config = config
        self.rank = rank
        self.world_size = config.tensor_parallel_size
        set_tp(rank, self.world_size)  # before the model is built: the layers take this rank's shard
        hf = config.hf_config
        self.block_size = config.kvcache_block_size
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, hf)
        # Every kernel decision (attention backend, compiled ops, our Triton kernels, sampler), made once here.
        self.kernels = choose_kernels(config, self.device)
        self.attention_backend = self.kernels.attention
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        with _default_dtype_device(self.dtype, self.device):
            self.model = Qwen3ForCausalLM(hf, self.kernels)
        load_model(self.model, config.model)
        # Buffers computed on the CPU for exactness (the RoPE table) follow the parameters to the device.
        self.model.to(self.device).eval()
        self.staging = Staging(self.device)
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.sampler = Sampler(config.seed, self.device)
        self._sample_calls = 0
        self.num_kv_heads = self.attn_layers[0].num_kv_heads
        self.head_dim = self.attn_layers[0].head_dim
        if self.device.type == "cuda":
            self.warmup_model()
        self.allocate_kv_cache()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_bs: list[int] = []
        self.graph_capture_seconds = None
        if self.device.type == "cuda" and not config.enforce_eager and self.kernels.graph_safe:
            t0 = time.perf_counter()
            self.capture_cudagraph()
            self.graph_capture_seconds = time.perf_counter() - t0

    @property
    def execution(self) -> str:
        """How decode steps run: "graph" when CUDA graphs were captured, else "eager"."""
        return "graph" if self.graphs else "eager"

    # --- memory ---------------------------------------------------------------------------------
    @property
    def kv_block_bytes(self) -> int:
        hf = self.config.hf_config
        itemsize = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * hf.num_hidden_layers * self.block_size * self.num_kv_heads * self.head_dim * itemsize

    @torch.inference_mode()
    def warmup_model(self):
        """Run the largest prefill once so the peak activation memory is known before sizing the pool."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        cfg = self.config
        seq_len = min(cfg.max_num_batched_tokens, cfg.max_model_len)
        num_seqs = max(1, min(cfg.max_num_batched_tokens // seq_len, cfg.max_num_seqs))
        from .sampling_params import SamplingParams

        seqs = [Sequence([0] * seq_len, SamplingParams(), -1 - i, self.block_size) for i in range(num_seqs)]
        for seq in seqs:
            seq.num_scheduled_tokens = seq_len
        self.run(seqs, True)
        self.staging.release()  # its buffers come back after the KV pool is sized, as other step tensors do
        torch.cuda.empty_cache()

    def allocate_kv_cache(self):
        cfg = self.config
        hf = cfg.hf_config
        block_bytes = self.kv_block_bytes
        if cfg.num_kvcache_blocks == -1:
            if cfg.kvcache_memory_bytes > 0:
                cfg.num_kvcache_blocks = cfg.kvcache_memory_bytes // block_bytes
            elif self.device.type == "cuda":
                free, total = torch.cuda.mem_get_info(self.device)
                used = total - free
                stats = torch.cuda.memory_stats(self.device)
                peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
                cfg.num_kvcache_blocks = int(total * cfg.gpu_memory_utilization - used - peak + current) // block_bytes
            else:
                # Enough for every sequence at full length, within a modest memory budget.
                want = cfg.max_num_seqs * -(-cfg.max_model_len // self.block_size)
                cfg.num_kvcache_blocks = max(1, min(want, DEFAULT_CPU_KV_BYTES // block_bytes))
        # Every rank must hold the same number of blocks (rank 0's block manager hands out ids for all).
        cfg.num_kvcache_blocks = all_reduce_min(cfg.num_kvcache_blocks, self.device)
        if cfg.num_kvcache_blocks < 1:
            raise ValueError(
                f"gpu_memory_utilization: no memory is left for the KV cache ({block_bytes} bytes a block); "
                "raise gpu_memory_utilization or lower max_num_batched_tokens")
        # Head-major inside a block (engine/kv_layout.py): one head's rows of a block are contiguous.
        shape = pool_shape(hf.num_hidden_layers, cfg.num_kvcache_blocks, self.block_size, self.num_kv_heads,
                           self.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        for i, layer in enumerate(self.attn_layers):
            layer.k_cache = self.kv_cache[0, i]
            layer.v_cache = self.kv_cache[1, i]

    # --- inputs ---------------------------------------------------------------------------------
    def _slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        bs = self.block_size
        table = seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def prepare_prefill(self, seqs: list[Sequence]) -> StepInputs:
        input_ids, positions, slot_mapping = [], [], []
        cu_q, cu_k = [0], [0]
        max_q = max_k = 0
        for seq in seqs:
            start = min(seq.num_cached_tokens, len(seq) - 1)
            end = start + seq.num_scheduled_tokens
            seqlen_k = end  # keys: everything up to the last position computed this step
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            cu_q.append(cu_q[-1] + end - start)
            cu_k.append(cu_k[-1] + seqlen_k)
            max_q, max_k = max(max_q, end - start), max(max_k, seqlen_k)
            if seq.block_table:  # warm-up sequences have none
                slot_mapping.extend(self._slots(seq, start, end))
        block_tables = None
        # Some sequence attends to a cached prefix, or the backend pages every prefill (not warm-up's, which
        # has no pool yet).
        if cu_k[-1] > cu_q[-1] or (self.kernels.prefill_block_tables and seqs[0].block_table):
            block_tables = self._block_tables(seqs)
        return StepInputs(input_ids, positions, slot_mapping, cu_q, cu_k, max_q, max_k, None, block_tables)

    def prepare_decode(self, seqs: list[Sequence]) -> StepInputs:
        return self.decode_inputs([seq.last_token for seq in seqs], [seq.num_tokens for seq in seqs],
                                  [seq.block_table for seq in seqs])

    def decode_inputs(self, input_ids: list[int], lengths: list[int], tables: list[list[int]]) -> StepInputs:
        """A decode step's inputs from each row's last token, length and block table (a scheduled batch's,
        or a planned one's under async scheduling)."""
        bs = self.block_size
        slot_mapping = [table[(n - 1) // bs] * bs + (n - 1) % bs for n, table in zip(lengths, tables)]
        inputs = StepInputs(input_ids, [n - 1 for n in lengths], slot_mapping, context_lens=list(lengths),
                            block_tables=self._pad(tables))
        if self.graphs and len(input_ids) <= self.graph_bs[-1]:
            inputs.execution = "graph"
            inputs.graph_batch = next(b for b in self.graph_bs if b >= len(input_ids))
        return inputs

    @staticmethod
    def _block_tables(seqs: list[Sequence]) -> list[list[int]]:
        return ModelRunner._pad([seq.block_table for seq in seqs])

    @staticmethod
    def _pad(tables: list[list[int]]) -> list[list[int]]:
        width = max(len(table) for table in tables)
        return [table + [-1] * (width - len(table)) for table in tables]

    # --- execution ------------------------------------------------------------------------------
    @phase("engine::prepare")
    def prepare(self, seqs: list[Sequence], is_prefill: bool) -> StepInputs:
        return self.prepare_prefill(seqs) if is_prefill else self.prepare_decode(seqs)

    @phase("engine::forward")
    @torch.inference_mode()
    def forward_logits(self, inputs: StepInputs, is_prefill: bool, ids_from=None) -> torch.Tensor:
        """Logits of each sequence's last position for this step: [num_seqs, vocab] (None off rank 0).
        `ids_from` (sampled ids on the device, row per input) takes input ids that are not known on the host
        yet from the step before: row i reads sampled[rows[i]] where rows[i] >= 0."""
        set_tp(self.rank, self.world_size)
        patch = None
        if ids_from is not None:
            sampled, rows = ids_from
            if rows == list(range(len(rows))):  # steady decode: row i reads sampled[i]
                patch = (sampled, len(rows), None, None)
            else:
                dst = [i for i, r in enumerate(rows) if r >= 0]
                patch = (sampled, None, dst, [rows[i] for i in dst])
        if inputs.execution == "graph":
            return self._replay(inputs, patch)
        i32, i64 = torch.int32, torch.int64
        index = patch is not None and patch[1] is None
        t = self.staging.upload(input_ids=(inputs.input_ids, i64), positions=(inputs.positions, i64),
                                cu_seqlens_q=(inputs.cu_seqlens_q, i32), cu_seqlens_k=(inputs.cu_seqlens_k, i32),
                                slot_mapping=(inputs.slot_mapping, i32), context_lens=(inputs.context_lens, i32),
                                block_tables=(inputs.block_tables, i32),
                                ids_dst=(patch[2] if index else None, i64), ids_src=(patch[3] if index else None, i64))
        if patch is not None:
            _patch_ids(t["input_ids"], patch, t.get("ids_dst"), t.get("ids_src"))
        set_context(Context(
            is_prefill=is_prefill,
            cu_seqlens_q=t.get("cu_seqlens_q"),
            cu_seqlens_k=t.get("cu_seqlens_k"),
            max_seqlen_q=inputs.max_seqlen_q or 0,
            max_seqlen_k=inputs.max_seqlen_k or 0,
            slot_mapping=t["slot_mapping"],
            context_lens=t.get("context_lens"),
            block_tables=t.get("block_tables"),
            cu_seqlens_q_host=inputs.cu_seqlens_q,
            cu_seqlens_k_host=inputs.cu_seqlens_k,
            context_lens_host=inputs.context_lens,
        ))
        try:
            hidden = self.model(t["input_ids"], t["positions"])
            return self.model.compute_logits(hidden)
        finally:
            reset_context()

    @phase("engine::sample")
    @torch.inference_mode()
    def sample(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        """The sampled ids, on the device (int64)."""
        temps = [s.temperature for s in seqs]
        top_k = any(s.top_k > 0 for s in seqs)
        top_p = any(s.top_p < 1.0 for s in seqs)
        # Copied while the forward pass may still run: the step's only wait is fetching the sampled ids.
        dev = self.staging.upload(temperatures=(temps, torch.float32),
                                  top_ks=([s.top_k for s in seqs] if top_k else None, torch.int64),
                                  top_ps=([s.top_p for s in seqs] if top_p else None, torch.float32))
        temperatures = dev["temperatures"]
        # One-pass Triton Gumbel-max instead of the torch sampler's passes over the logits; top-k/top-p batches
        # keep the torch sampler.
        if self.kernels.gumbel_sampler and not (top_k or top_p):
            from .kernels.gumbel_sampler import gumbel_argmax

            self._sample_calls += 1
            return gumbel_argmax(logits, temperatures, self.config.seed * 1_000_003 + self._sample_calls)
        greedy = sum(t <= 0 for t in temps)
        greedy_rows = "all" if greedy == len(temps) else ("none" if greedy == 0 else "some")
        return self.sampler(logits, temperatures, dev.get("top_ks"), dev.get("top_ps"), greedy_rows)

    def run(self, seqs: list[Sequence], is_prefill: bool, on_inputs=None,
            choose_tokens=None) -> tuple[list[int] | None, StepInputs]:
        """One step on this rank: build the inputs, run the model and, on rank 0 (where the logits are
        gathered), pick the tokens: sampled, or `choose_tokens(seqs, logits)`'s. Returns (tokens or None,
        the inputs). `on_inputs(inputs)` sees the inputs before the forward pass (the engine's tracer)."""
        launched = self.launch(seqs, is_prefill, on_inputs, choose_tokens)
        return launched.token_ids(), launched.inputs

    def launch(self, seqs: list[Sequence], is_prefill: bool, on_inputs=None, choose_tokens=None) -> "Launched":
        """run() without waiting: the step is queued on the device and its ids are on their way back."""
        inputs = self.prepare(seqs, is_prefill)
        if on_inputs is not None:
            on_inputs(inputs)
        logits = self.forward_logits(inputs, is_prefill)
        if self.rank != 0:
            return Launched(inputs)
        if choose_tokens is not None:
            return Launched(inputs, chosen=list(choose_tokens(seqs, logits)))
        sampled = self.sample(seqs, logits)
        return Launched(inputs, sampled, self.staging.fetch(sampled))

    @staticmethod
    def planned_step(plan: list[tuple[Sequence, int, list[int], int]], previous: "Launched") -> tuple:
        """What a tensor-parallel worker needs of a planned step (launch_planned's arguments): each row's
        known last token (0 where it comes from the previous step's samples), length, block table and row in
        the previous step, and how many ids the previous step sampled."""
        return ([0 if r >= 0 else seq.last_token for seq, _, _, r in plan], [row[1] for row in plan],
                [row[2] for row in plan], [row[3] for row in plan], len(previous.inputs.input_ids))

    def launch_ahead(self, plan: list[tuple[Sequence, int, list[int], int]], planned: tuple,
                     previous: "Launched") -> "Ahead":
        """Queue the planned next decode step (Scheduler.plan_next_decode; `planned` is planned_step's view
        of it) behind `previous`, whose sampled ids it reads on the device. The engine adopts it if the real
        schedule matches, else discards it. Under tensor parallel the workers run launch_planned meanwhile."""
        ids, lengths, tables, rows, _ = planned
        inputs = self.decode_inputs(ids, lengths, tables)
        rng = (self._sample_calls, self.sampler.generator.get_state())
        set_tp(self.rank, self.world_size)
        broadcast_from_rank0(previous.sampled)  # the workers' input ids (a no-op in one process)
        logits = self.forward_logits(inputs, False, ids_from=(previous.sampled, rows))
        sampled = self.sample([row[0] for row in plan], logits)
        return Ahead(plan, Launched(inputs, sampled, self.staging.fetch(sampled)), rng)

    def launch_planned(self, ids: list[int], lengths: list[int], tables: list[list[int]], rows: list[int],
                       num_previous: int) -> None:
        """A worker's part of rank 0's launch_ahead: the previous step's sampled ids come from rank 0."""
        set_tp(self.rank, self.world_size)
        sampled = broadcast_from_rank0(torch.empty(num_previous, dtype=torch.int64, device=self.device))
        self.forward_logits(self.decode_inputs(ids, lengths, tables), False, ids_from=(sampled, rows))

    def adopt(self, ahead: "Ahead", seqs: list[Sequence]) -> "Launched":
        """The planned step is the scheduled one: its inputs now get the ids the host has learnt since."""
        ahead.launched.inputs.input_ids = [seq.last_token for seq in seqs]
        return ahead.launched

    def discard(self, ahead: "Ahead") -> None:
        """The planned step was not the scheduled one: forget it, and rewind the sampler's random stream
        so the step that runs instead draws what it would have drawn without async scheduling. (The KV it
        wrote went to slots nobody reads: see Scheduler.plan_next_decode.)"""
        self._sample_calls, state = ahead.rng
        self.sampler.generator.set_state(state)

    # --- CUDA graphs ---------------------------------------------------------------------------
    @torch.inference_mode()
    def capture_cudagraph(self):
        """One graph per decode batch bucket ([1, 2, 4, 8] + multiples of 16 up to max_num_seqs, as nano);
        a batch larger than the largest bucket runs eagerly.

        Every graph input lives in one int32 device buffer laid out [ids | positions | slots | context
        lengths | block tables] (graph_input_views); a step fills it through the staging buffer with a single
        asynchronous copy, instead of one copy kernel per input."""
        from .kernels.decode_attention import num_splits_for

        cfg = self.config
        set_tp(self.rank, self.world_size)
        max_bs = min(cfg.max_num_seqs, 512)
        max_blocks = -(-cfg.max_model_len // self.block_size)
        hidden = cfg.hf_config.hidden_size
        dev = self.device
        size = 4 * max_bs + max_bs * max_blocks
        self._graph_inputs = torch.zeros(size, dtype=torch.int32, device=dev)
        self.staging.reserve(self._graph_inputs.numel() * self._graph_inputs.element_size())
        self.graph_vars = gv = graph_input_views(self._graph_inputs, max_bs, max_blocks)
        gv["outputs"] = torch.zeros(max_bs, hidden, dtype=self.dtype, device=dev)
        gv["slot_mapping"].fill_(-1)
        self.graph_max_bs, self.graph_max_blocks = max_bs, max_blocks
        self.graph_bs = [b for b in [1, 2, 4, 8] if b <= max_bs] + list(range(16, max_bs + 1, 16))
        sms = num_sms(dev, 0)
        self.graph_splits = {bs: num_splits_for(bs, self.num_kv_heads, cfg.max_model_len, sms) for bs in self.graph_bs}
        pool = None
        # Small buckets split each context across programs (and merge the parts in a second kernel) so that
        # long contexts fill the GPU; while every context is short, one program per head reading it all is
        # faster than the split and the merge launch. Those buckets get a second graph of one split.
        self.short_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        for bs in reversed(self.graph_bs):
            for graphs, splits in ((self.graphs, self.graph_splits[bs]),
                                   (self.short_graphs, 1 if self.graph_splits[bs] > 1 else None)):
                if splits is None:
                    continue
                graph = torch.cuda.CUDAGraph()
                set_context(Context(is_prefill=False, slot_mapping=gv["slot_mapping"][:bs],
                                    context_lens=gv["context_lens"][:bs], block_tables=gv["block_tables"][:bs],
                                    num_splits=splits))
                gv["outputs"][:bs] = self.model(gv["input_ids"][:bs], gv["positions"][:bs])  # warm-up
                with torch.cuda.graph(graph, pool):
                    gv["outputs"][:bs] = self.model(gv["input_ids"][:bs], gv["positions"][:bs])
                if pool is None:
                    pool = graph.pool()
                graphs[bs] = graph
                torch.cuda.synchronize()
                reset_context()

    def _replay(self, inputs: StepInputs, patch=None) -> torch.Tensor:
        self.staging.upload_into(self._graph_inputs, lambda host: fill_graph_inputs(
            host, inputs, self.graph_max_bs, self.graph_max_blocks))
        if patch is not None:
            index = {} if patch[1] is not None else self.staging.upload(
                ids_dst=(patch[2], torch.int64), ids_src=(patch[3], torch.int64))
            _patch_ids(self.graph_vars["input_ids"], patch, index.get("ids_dst"), index.get("ids_src"))
        bucket = inputs.graph_batch
        short = bucket in self.short_graphs and max(inputs.context_lens) <= SHORT_CONTEXT
        (self.short_graphs if short else self.graphs)[bucket].replay()
        set_context(Context(is_prefill=False))
        try:
            return self.model.compute_logits(self.graph_vars["outputs"][:len(inputs.input_ids)])
        finally:
            reset_context()

    def exit(self):
        self.graphs = {}
        self.short_graphs = {}
        self.graph_vars = None
        self._graph_inputs = None
        self.staging.release()
        for layer in self.attn_layers:
            layer.k_cache = layer.v_cache = torch.tensor([])
        self.kv_cache = None
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

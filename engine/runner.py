"""ModelRunner: owns the model and the paged KV pool, turns a scheduled batch into tensors, runs the
forward pass and samples. The only host sync per step is fetching the sampled ids."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np
import torch

from .batch_plan import BatchPlan
from .config import Config
from .context import Context, DecodeMeta, PrefillMeta, reset_context, set_context
from .decode_order import DECODE_ORDER, longest_first
from .device import num_sms, resolve_device, resolve_dtype
from .distributed import all_reduce_min, broadcast_from_rank0, set_tp
from .graph_dispatch import GRAPH_SAMPLE_BS, GraphDispatch, decode_buckets, short_graph_splits
from .kernel_choice import choose_kernels
from .kv_layout import FP8_V_TRANSPOSED, layer_caches, pool_shape
from .kv_quant import FP8, cache_dtype
from .layers.attention import Attention
from .loader import load_model
from .models.qwen3 import Qwen3ForCausalLM
from .profiling import phase
from .sampler import DeviceSampling
from .staging import Staging

# A CPU KV pool takes at most this much memory unless num_kvcache_blocks / kvcache_memory_bytes say otherwise.
DEFAULT_CPU_KV_BYTES = 512 << 20


@dataclass
class StepInputs:
    """Host-side view of one step's model inputs, built from its BatchPlan (what the tracer records as
    gpu_inputs). Tokens are the decode rows' first, then the prefill rows'."""
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    num_decodes: int = 0
    # Prefill rows only (None in a decode step):
    cu_seqlens_q: list[int] | None = None
    cu_seqlens_k: list[int] | None = None
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None
    # Decode rows only (None in a prefill step):
    context_lens: list[int] | None = None
    # Every row's blocks, padded with -1 (decode rows first): in a step with decode rows, in a prefill that
    # reads a cached prefix, and in every prefill for a backend that reads all keys through the pool
    # (KernelChoice.prefill_block_tables).
    block_tables: list[list[int]] | None = None
    execution: str = "eager"
    graph_batch: int | None = None       # the graph's decode rows
    graph_prefill: int | None = None     # a mixed step's graph: its prefill tokens (engine/mixed_graphs.py)


class Launched:
    """A step queued on the device: its inputs and (rank 0) its sampled ids, on the device and on their way
    to the host, or the ids a host-side sampling strategy chose."""

    __slots__ = ("inputs", "sampled", "_fetch", "_chosen")

    def __init__(self, inputs: StepInputs, sampled: torch.Tensor | None = None, fetch=None,
                 chosen: list[int] | None = None):
        self.inputs, self.sampled, self._fetch, self._chosen = inputs, sampled, fetch, chosen

    def token_ids(self) -> list[int] | None:
        """The sampling rows' ids on the host (waits for the device); None off rank 0."""
        if self._chosen is not None:
            return self._chosen
        return None if self._fetch is None else self._fetch.tolist()


def _id_patch(from_previous: list[int] | None) -> tuple[list[int], list[int]] | None:
    """(destination rows, source rows) for copying the previous step's samples into this step's input ids;
    None when decode row i takes sample i for every row (steady decode: one plain copy)."""
    if from_previous is None or all(r == i for i, r in enumerate(from_previous)):
        return None
    dst = [i for i, r in enumerate(from_previous) if r >= 0]
    return dst, [from_previous[i] for i in dst]


def _copy_ids(ids: torch.Tensor, previous: torch.Tensor, n: int, dst, src) -> None:
    """The previous step's sampled ids into this step's input ids, on the device."""
    if dst is None:
        ids[:n].copy_(previous[:n])
    else:
        ids.index_copy_(0, dst, previous.index_select(0, src).to(ids.dtype))


def graph_input_size(max_bs: int, max_blocks: int) -> int:
    """int32 elements of the decode graphs' input buffer (graph_input_views)."""
    return 12 * max_bs + max_bs * max_blocks


def graph_input_views(buf: torch.Tensor, max_bs: int, max_blocks: int) -> dict[str, torch.Tensor]:
    """The decode graphs' inputs as views of one flat int32 buffer: [ids | positions | slots | context
    lengths | temperatures (float32) | order | . | seeds (int64) | . | block tables], each of max_bs rows (the last
    three 16-byte aligned for any max_bs). The tables come last, so rows [:bs] of every input are covered by one
    prefix of the buffer (see fill_graph_inputs). Temperatures and seeds feed a graph that draws its tokens
    (GRAPH_SAMPLE_BS)."""
    return {
        "input_ids": buf[0:max_bs],
        "positions": buf[max_bs:2 * max_bs],
        "slot_mapping": buf[2 * max_bs:3 * max_bs],
        "context_lens": buf[3 * max_bs:4 * max_bs],
        "temperatures": buf[4 * max_bs:5 * max_bs].view(torch.float32),
        "order": buf[5 * max_bs:6 * max_bs],
        "seeds": buf[8 * max_bs:10 * max_bs].view(torch.int64),
        "block_tables": buf[12 * max_bs:12 * max_bs + max_bs * max_blocks].view(max_bs, max_blocks),
    }


def fill_graph_inputs(a, inputs: StepInputs, max_bs: int, max_blocks: int,
                      draw: tuple[list[float], list[int]] | None = None, order: bool = False) -> int:
    """Write one decode step into `a` (a numpy int32 view of the host mirror, laid out as graph_input_views);
    return how many leading elements must reach the device. Padding rows up to the bucket read token 0 at
    position 0, write no KV (slot -1) and attend to nothing (context 0); table entries past a row's width
    and rows past the bucket are never read. draw: the rows' (temperatures, seeds) for a graph that samples;
    its padding rows draw greedily from seed 0 (their ids are dropped). order: the bucket's rows longest first,
    for a graph captured with an order (engine/decode_order.py; padding rows last)."""
    bs, bucket = len(inputs.input_ids), inputs.graph_batch
    a[0:bs] = inputs.input_ids
    a[bs:bucket] = 0  # the staging buffer is shared: padding rows must not keep another upload's bytes
    a[max_bs:max_bs + bs] = inputs.positions
    a[max_bs + bs:max_bs + bucket] = 0  # (as ids and positions, those index the embedding and RoPE tables)
    a[2 * max_bs:2 * max_bs + bs] = inputs.slot_mapping
    a[2 * max_bs + bs:2 * max_bs + bucket] = -1
    a[3 * max_bs:3 * max_bs + bs] = inputs.context_lens
    a[3 * max_bs + bs:3 * max_bs + bucket] = 0
    if draw is not None:
        temps, seeds = a[4 * max_bs:5 * max_bs].view(np.float32), a[8 * max_bs:10 * max_bs].view(np.int64)
        temps[:bs], seeds[:bs] = draw
        temps[bs:bucket] = 0.0
        seeds[bs:bucket] = 0
    if order:
        a[5 * max_bs:5 * max_bs + bucket] = longest_first(inputs.context_lens, bucket)
    tables = inputs.block_tables
    t0 = 12 * max_bs
    a[t0:t0 + bs * max_blocks].reshape(bs, max_blocks)[:, :len(tables[0])] = tables
    return t0 + bs * max_blocks


class _Laps:
    """lap(name): the seconds since the last lap (or since this was made) go into `into[name]`."""

    def __init__(self, into: dict[str, float]):
        self.into, self.t = into, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = now - self.t
        self.t = now


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
        # Where start-up goes, phase by phase (seconds; docs/perf.md has the table on one H200).
        self.startup_seconds: dict[str, float] = {}
        lap = _Laps(self.startup_seconds)
        set_tp(rank, self.world_size)  # before the model is built: the layers take this rank's shard
        hf = config.hf_config
        self.block_size = config.kvcache_block_size
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, hf)
        self.kv_dtype = cache_dtype(config.kv_cache_dtype, self.dtype)  # the pool's: an FP8 one halves a block
        self.v_transposed = False  # (set with the pool: engine/kv_layout.py)
        # Every kernel decision (attention backend, our Triton kernels, sampler), made once here.
        self.kernels = choose_kernels(config, self.device)
        self.attention_backend = self.kernels.attention
        # Only our Triton decode kernel takes a launch order (engine/decode_order.py).
        self.decode_order = DECODE_ORDER == "longest-first" and self.attention_backend == "triton"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        lap("kernels and device")
        with _default_dtype_device(self.dtype, self.device):
            self.model = Qwen3ForCausalLM(hf, self.kernels)
        lap("build model")
        load_model(self.model, config.model)
        # Buffers computed on the CPU for exactness (the RoPE table) follow the parameters to the device.
        self.model.to(self.device).eval()
        lap("load weights")
        self.staging = Staging(self.device)
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        # How rank 0 picks each step's tokens (engine/sampler.py); the engine may swap in another strategy.
        self.sampling = self._device_sampling = DeviceSampling(config.seed, self.device, self.staging,
                                                               self.kernels.gumbel_sampler)
        self._sampled: torch.Tensor | None = None  # the last step's sampled ids, on the device (rank 0)
        self._num_sampled = 0                      # how many rows the last step sampled (every rank)
        self.drawn: torch.Tensor | None = None    # this step's ids when its graph drew them (rank 0)
        self.num_kv_heads = self.attn_layers[0].num_kv_heads
        self.head_dim = self.attn_layers[0].head_dim
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # A graph that ends in the LM head and the draw (GRAPH_SAMPLE_BS): its logits and ids, live in its pool.
        self.graph_heads: dict[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]] = {}
        self.graph_bs: list[int] = []
        self.mixed_graphs = None
        self.dispatch = GraphDispatch()  # which graph a step replays (engine/graph_dispatch.py); none captured yet
        self.graph_capture_seconds = None
        if self.device.type == "cuda":
            self.warmup_model()
            lap("warm-up forward")
        self.allocate_kv_cache()
        lap("kv cache")
        if self.device.type == "cuda" and not config.enforce_eager and self.kernels.graph_safe:
            pool = self.capture_cudagraph()
            lap("capture decode graphs")
            if config.policy.mixes_phases:  # (only such a policy makes a step with both kinds of row)
                self.capture_mixed_graphs(pool)
                lap("capture mixed graphs")
            mixed = self.mixed_graphs
            self.dispatch = GraphDispatch(tuple(self.graph_bs), frozenset(self.short_graphs),
                                          *((tuple(mixed.rows), tuple(mixed.tokens)) if mixed else ()))
            self.graph_capture_seconds = sum(v for k, v in self.startup_seconds.items() if k.startswith("capture"))

    @property
    def execution(self) -> str:
        """How decode steps run: "graph" when CUDA graphs were captured, else "eager"."""
        return "graph" if self.graphs else "eager"

    # --- memory ---------------------------------------------------------------------------------
    @property
    def kv_block_bytes(self) -> int:
        hf = self.config.hf_config
        itemsize = torch.tensor([], dtype=self.kv_dtype).element_size()
        return 2 * hf.num_hidden_layers * self.block_size * self.num_kv_heads * self.head_dim * itemsize

    @torch.inference_mode()
    def warmup_model(self):
        """Run the largest prefill once so the peak activation memory is known before sizing the pool."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.largest_prefill()
        self.staging.release()  # its buffers come back after the KV pool is sized, as other step tensors do
        torch.cuda.empty_cache()

    @torch.inference_mode()
    def largest_prefill(self) -> torch.Tensor:
        """The largest prefill a step can hold, in prompts with no blocks: nothing is written, nothing sampled;
        returns the logits of its last positions."""
        cfg = self.config
        seq_len = min(cfg.max_num_batched_tokens, cfg.max_model_len)
        n = max(1, min(cfg.max_num_batched_tokens // seq_len, cfg.max_num_seqs))
        plan = BatchPlan([-1 - i for i in range(n)], [""] * n, 0, [0] * n, [seq_len] * n, [seq_len] * n,
                         [0] * (n * seq_len), [[] for _ in range(n)])
        set_tp(self.rank, self.world_size)
        return self._logits(plan, self.step_inputs(plan), None)

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
        # Zeros, not empty: every byte of an FP8 pool is a finite value (never NaN), which lets the keys-contiguous
        # V layout's decode tiles read past a context's end unmasked (engine/kernels/decode_attention.py).
        self.kv_cache = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        self.v_transposed = FP8_V_TRANSPOSED and self.kv_dtype == FP8
        for i, layer in enumerate(self.attn_layers):
            layer.k_cache, layer.v_cache = layer_caches(self.kv_cache, i, self.v_transposed)

    # --- inputs ---------------------------------------------------------------------------------
    @phase("engine::prepare")
    def step_inputs(self, plan: BatchPlan) -> StepInputs:
        """The model inputs of a plan: every new token's id, position and KV slot, and each part's metadata."""
        bs = self.block_size
        nd = plan.num_decodes
        starts, tables = plan.starts, plan.block_tables
        positions = starts[:nd]
        slots = [t[p // bs] * bs + p % bs for p, t in zip(positions, tables)]
        inputs = StepInputs(plan.input_ids, positions, slots, nd)
        if nd:
            inputs.context_lens = [p + 1 for p in positions]
        if nd < len(plan):
            positions = inputs.positions = list(positions)
            cu_q, cu_k = [0], [0]
            for start, n, table in zip(starts[nd:], plan.num_new[nd:], tables[nd:]):
                end = start + n
                positions.extend(range(start, end))
                if not table:  # (warm-up's rows have no blocks: they write nothing)
                    slots.extend([-1] * n)
                for b in range(start // bs, (end - 1) // bs + 1) if table else ():
                    lo, hi = max(start, b * bs), min(end, (b + 1) * bs)
                    slots.extend(range(table[b] * bs + lo - b * bs, table[b] * bs + hi - b * bs))
                cu_q.append(cu_q[-1] + n)
                cu_k.append(cu_k[-1] + end)
            inputs.cu_seqlens_q, inputs.cu_seqlens_k = cu_q, cu_k
            inputs.max_seqlen_q = max(plan.num_new[nd:])
            inputs.max_seqlen_k = max(cu_k[i + 1] - cu_k[i] for i in range(len(cu_k) - 1))
            # Keys through the pool: a cached prefix (or a chunk's earlier part), a backend that always reads
            # them there, or a mixed step (its decode rows need tables anyway).
            paged = nd or cu_k[-1] > cu_q[-1] or self.kernels.prefill_block_tables
            if paged and tables[nd]:
                inputs.block_tables = self._pad(tables)
        else:
            inputs.block_tables = self._pad(tables)
        key = self.graph_key(plan)
        if key is not None:
            inputs.execution = "graph"
            inputs.graph_batch, inputs.graph_prefill = key
        return inputs

    def graph_key(self, plan: BatchPlan) -> tuple[int, int | None] | None:
        """The captured graph a plan replays: (decode rows, prefill tokens; None for a decode graph), or None
        when it runs eagerly."""
        return self.dispatch.key(plan)

    @staticmethod
    def _pad(tables: list[list[int]]) -> list[list[int]]:
        width = max(len(table) for table in tables)
        return [table + [-1] * (width - len(table)) for table in tables]

    @staticmethod
    def logits_rows(plan: BatchPlan) -> list[int] | None:
        """Which token rows of the step's hidden states give logits: each sampling row's last token (None:
        every token, a decode step in which every row samples)."""
        samples = plan.samples
        nd = plan.num_decodes
        if nd == len(plan) and all(samples):
            return None
        rows, end = [], nd
        for i, ok in enumerate(samples):
            if i >= nd:
                end += plan.num_new[i]
            if ok:
                rows.append(i if i < nd else end - 1)
        return rows

    # --- execution ------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: BatchPlan) -> Launched:
        """One step on this rank (every rank runs this for every plan, in the same order): build the inputs,
        run the model and, on rank 0 (where the logits are gathered), sample the sampling rows. Returns at
        once: the step is queued on the device and its ids are on their way to the host."""
        set_tp(self.rank, self.world_size)
        inputs = self.step_inputs(plan)
        previous = None
        if plan.from_previous is not None:
            # Async scheduling: some input ids are the previous step's samples, still on the device. Rank 0
            # hands them to the other ranks (a no-op in one process).
            previous = self._sampled if self.rank == 0 else torch.empty(
                self._num_sampled, dtype=torch.int64, device=self.device)
            previous = broadcast_from_rank0(previous)
        logits = self._logits(plan, inputs, previous)
        self._num_sampled = len(plan.sample_rows)
        if self.rank != 0:
            return Launched(inputs)
        picked = self.drawn if self.drawn is not None else self.sampling(plan, logits)
        if isinstance(picked, list):  # a host-side strategy (teacher forcing)
            self._sampled = None
            return Launched(inputs, chosen=picked)
        self._sampled = picked
        return Launched(inputs, picked, self.staging.fetch(picked))

    @phase("engine::forward")
    def _logits(self, plan: BatchPlan, inputs: StepInputs, previous: torch.Tensor | None) -> torch.Tensor | None:
        """The sampling rows' logits (None off rank 0): a graph replay or an eager pass, then the LM head. A
        small decode graph runs the LM head itself, and may draw the tokens too (then self.drawn holds them)."""
        self.drawn = None
        try:
            if inputs.execution == "eager":
                hidden = self._forward(plan, inputs, previous)
            elif inputs.graph_prefill is None:
                hidden, head = self._replay(plan, inputs, previous)
                if head is not None:
                    return head
            else:
                hidden = self._replay_mixed(plan, inputs, previous)
            return self.model.compute_logits(hidden)
        finally:
            reset_context()

    def _forward(self, plan: BatchPlan, inputs: StepInputs, previous: torch.Tensor | None) -> torch.Tensor:
        """An eager forward pass of any plan; leaves the context set for compute_logits."""
        i32, i64 = torch.int32, torch.int64
        nd = inputs.num_decodes
        rows = self.logits_rows(plan)
        dst, src = _id_patch(plan.from_previous) or (None, None)
        order = longest_first(inputs.context_lens).tolist() if self.decode_order and nd > 1 else None
        t = self.staging.upload(input_ids=(inputs.input_ids, i64), positions=(inputs.positions, i64),
                                slot_mapping=(inputs.slot_mapping, i32), context_lens=(inputs.context_lens, i32),
                                order=(order, i32),
                                cu_seqlens_q=(inputs.cu_seqlens_q, i32), cu_seqlens_k=(inputs.cu_seqlens_k, i32),
                                block_tables=(inputs.block_tables, i32), logits_rows=(rows, i64),
                                ids_dst=(dst, i64), ids_src=(src, i64))
        if previous is not None:
            _copy_ids(t["input_ids"], previous, nd, t.get("ids_dst"), t.get("ids_src"))
        tables = t.get("block_tables")
        decode = prefill = None
        if nd:
            decode = DecodeMeta(nd, t["context_lens"], tables[:nd], inputs.context_lens, order=t.get("order"))
        if nd < len(plan):
            prefill = PrefillMeta(t["cu_seqlens_q"], t["cu_seqlens_k"], inputs.max_seqlen_q, inputs.max_seqlen_k,
                                  None if tables is None else tables[nd:], inputs.cu_seqlens_q, inputs.cu_seqlens_k)
        set_context(Context(t["slot_mapping"], decode, prefill, t.get("logits_rows")))
        return self.model(t["input_ids"], t["positions"])

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
        size = graph_input_size(max_bs, max_blocks)
        self._graph_inputs = torch.zeros(size, dtype=torch.int32, device=dev)
        self.staging.reserve(self._graph_inputs.numel() * self._graph_inputs.element_size())
        self.graph_vars = gv = graph_input_views(self._graph_inputs, max_bs, max_blocks)
        gv["outputs"] = torch.zeros(max_bs, hidden, dtype=self.dtype, device=dev)
        gv["slot_mapping"].fill_(-1)
        gv["order"].copy_(torch.arange(max_bs, dtype=torch.int32))
        self.graph_max_bs, self.graph_max_blocks = max_bs, max_blocks
        self.graph_bs = decode_buckets(max_bs)
        sms = num_sms(dev, 0)
        self.graph_splits = {bs: num_splits_for(bs, self.num_kv_heads, cfg.max_model_len, sms) for bs in self.graph_bs}
        pool = None
        # Small buckets split each context across programs (and merge the parts) so that long contexts fill the
        # GPU; while every context is short, fewer splits are faster (a few programs a head at one row, one from
        # four rows on: engine/graph_dispatch.py). Those buckets get a second graph of that split count.
        self.short_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # (one process only: under tensor parallel the LM head's gather is a collective of its own)
        head_bs = GRAPH_SAMPLE_BS if self.world_size == 1 and self.kernels.gumbel_sampler else 0
        for bs in reversed(self.graph_bs):
            for graphs, splits in ((self.graphs, self.graph_splits[bs]),
                                   (self.short_graphs, short_graph_splits(bs, self.graph_splits[bs]))):
                if splits is None:
                    continue
                graph = torch.cuda.CUDAGraph()
                set_context(Context(gv["slot_mapping"][:bs], self.graph_decode_meta(bs, splits)))
                self._graph_body(bs, bs <= head_bs)  # warm-up (and compiles, outside the capture)
                with torch.cuda.graph(graph, pool):
                    head = self._graph_body(bs, bs <= head_bs)
                if pool is None:
                    pool = graph.pool()
                graphs[bs] = graph
                if head is not None:
                    self.graph_heads[graph] = head
                torch.cuda.synchronize()
                reset_context()
        return pool

    def graph_decode_meta(self, bs: int, splits: int) -> DecodeMeta:
        """What a decode graph of bs rows captures as its attention's inputs: views of the graph input buffer
        (lengths, tables and, with a launch order, the order fill_graph_inputs writes), and its split count."""
        gv = self.graph_vars
        return DecodeMeta(bs, gv["context_lens"][:bs], gv["block_tables"][:bs], num_splits=splits,
                          order=gv["order"][:bs] if self.decode_order else None)

    def _graph_body(self, bs: int, head: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """What a decode graph of bs rows runs: the model into the outputs buffer; with head, then the LM head
        and the Gumbel draw from the buffer's temperatures and seeds (returns the logits and the ids)."""
        gv = self.graph_vars
        gv["outputs"][:bs] = self.model(gv["input_ids"][:bs], gv["positions"][:bs])
        if not head:
            return None
        from .kernels.gumbel_sampler import gumbel_argmax

        logits = self.model.compute_logits(gv["outputs"][:bs])
        return logits, gumbel_argmax(logits, gv["temperatures"][:bs], gv["seeds"][:bs])

    def _replay(self, plan: BatchPlan, inputs: StepInputs, previous: torch.Tensor | None):
        """A decode graph's replay: (the hidden states, None), or (None, the logits) from a graph that runs the
        LM head; if that graph may also draw this plan's tokens (DeviceSampling.in_graph), self.drawn = ids."""
        bucket = inputs.graph_batch
        graph = (self.short_graphs if self.dispatch.one_split(bucket, inputs.context_lens) else self.graphs)[bucket]
        head = self.graph_heads.get(graph)
        draw = self.sampling.in_graph(plan) if head is not None and self.sampling is self._device_sampling else None
        self.staging.upload_into(self._graph_inputs, lambda host: fill_graph_inputs(
            host, inputs, self.graph_max_bs, self.graph_max_blocks, draw, self.decode_order))
        if previous is not None:
            dst, src = _id_patch(plan.from_previous) or (None, None)
            index = {} if dst is None else self.staging.upload(ids_dst=(dst, torch.int64), ids_src=(src, torch.int64))
            _copy_ids(self.graph_vars["input_ids"], previous, inputs.num_decodes, index.get("ids_dst"),
                      index.get("ids_src"))
        graph.replay()
        set_context(Context())
        n = inputs.num_decodes
        if head is None:
            return self.graph_vars["outputs"][:n], None
        if draw is not None:
            self.drawn = head[1][:n]
        # (the graph's logits are overwritten by its next replay: a host-side strategy may keep the rows)
        return None, head[0][:n] if self.sampling is self._device_sampling else head[0][:n].clone()

    @torch.inference_mode()
    def capture_mixed_graphs(self, pool) -> None:
        from .kernels.decode_attention import num_splits_for
        from .mixed_graphs import MixedGraphs

        cfg = self.config
        set_tp(self.rank, self.world_size)
        sms = num_sms(self.device, 0)
        self.mixed_graphs = MixedGraphs(
            self.model, self.device, min(cfg.max_num_seqs, 512), cfg.max_num_batched_tokens,
            -(-cfg.max_model_len // self.block_size), cfg.hf_config.hidden_size, self.dtype,
            lambda d: num_splits_for(d, self.num_kv_heads, cfg.max_model_len, sms))
        self.staging.reserve(self.mixed_graphs.buf.numel() * 4)
        self.mixed_graphs.capture(pool)

    def _replay_mixed(self, plan: BatchPlan, inputs: StepInputs, previous: torch.Tensor | None) -> torch.Tensor:
        graphs = self.mixed_graphs
        key = (inputs.graph_batch, inputs.graph_prefill)
        self.staging.upload_into(graphs.buf, lambda host: graphs.fill(host, inputs, key))
        dst, src = _id_patch(plan.from_previous) or (None, None)
        rows = graphs.logits_rows(inputs, self.logits_rows(plan), key)
        t = self.staging.upload(logits_rows=(rows, torch.int64), ids_dst=(dst, torch.int64), ids_src=(src, torch.int64))
        if previous is not None:
            _copy_ids(graphs.view["ids"], previous, inputs.num_decodes, t.get("ids_dst"), t.get("ids_src"))
        hidden = graphs.replay(key)
        set_context(Context(logits_indices=t.get("logits_rows")))
        return hidden

    def exit(self):
        self.mixed_graphs = None
        self.graphs = {}
        self.short_graphs = {}
        self.graph_heads = {}
        self.graph_vars = None
        self._graph_inputs = None
        self.staging.release()
        for layer in self.attn_layers:
            layer.k_cache = layer.v_cache = torch.tensor([])
        self.kv_cache = None
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

"""CUDA graphs for mixed steps (decode rows and prefill chunks in one step, scheduling_policy="mixed").

Run eagerly, such a step is host-bound: 28 layers of a dozen launches cost ~30 ms of Python on the H200
whatever the step's size (docs/serving.md), which would be every stream's gap between tokens. Captured,
the host uploads the inputs and replays one graph.

A graph holds D decode rows and P prefill tokens (in at most ROWS prefill rows), and a step is padded up to
the smallest (D, P) pair that holds it: padding decode rows attend to nothing (context 0), padding prefill
rows have no tokens (their query tiles exit at once), padding tokens write no KV (slot -1) and their
hidden rows are never read. The attention kernels are the eager step's: the decode kernel over the first D
tokens with a split count fixed per graph, the varlen prefill kernel over the rest with a grid sized for P
tokens. Every input lives in one int32 device buffer, filled with one asynchronous copy per step.
"""
from __future__ import annotations

import torch

from .context import Context, DecodeMeta, PrefillMeta, reset_context, set_context
from .graph_dispatch import MIXED_PREFILL_ROWS

DECODE_ROWS = (0, 8, 32, 64, 128, 256, 512)
PREFILL_TOKENS = (512, 2048)
ROWS = MIXED_PREFILL_ROWS  # prefill rows a graph holds; a step with more runs eagerly (engine/graph_dispatch.py)


def buckets(max_decode: int, budget: int) -> tuple[list[int], list[int]]:
    """The (decode rows, prefill tokens) sizes to capture for these limits."""
    rows = [d for d in DECODE_ROWS if d < max_decode] + [max_decode]
    tokens = sorted({p for p in PREFILL_TOKENS if p < budget} | {budget})
    return rows, tokens


class MixedGraphs:
    def __init__(self, model, device, max_decode: int, budget: int, max_blocks: int, hidden: int, dtype,
                 num_splits_for):
        self.model = model
        self.rows, self.tokens = buckets(max_decode, budget)
        self.max_blocks = max_blocks
        d, p = self.rows[-1], self.tokens[-1]
        self.t_max = d + p
        # [ids | positions | slots (t_max each) | context lens (d) | cu_q | cu_k (ROWS + 1 each) |
        #  decode tables (d x max_blocks) | prefill tables (ROWS x max_blocks)]
        self.layout = {}
        at = 0
        for name, n in (("ids", self.t_max), ("positions", self.t_max), ("slots", self.t_max), ("context_lens", d),
                        ("cu_q", ROWS + 1), ("cu_k", ROWS + 1), ("decode_tables", d * max_blocks),
                        ("prefill_tables", ROWS * max_blocks)):
            self.layout[name] = (at, n)
            at += n
        self.buf = torch.zeros(at, dtype=torch.int32, device=device)
        self.view = {k: self.buf[a:a + n] for k, (a, n) in self.layout.items()}
        self.outputs = torch.zeros(self.t_max, hidden, dtype=dtype, device=device)
        self.num_splits_for = num_splits_for
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def capture(self, pool=None):
        v, w = self.view, self.max_blocks
        v["slots"].fill_(-1)
        for p in reversed(self.tokens):
            for d in reversed(self.rows):
                t = d + p
                decode = None if not d else DecodeMeta(d, v["context_lens"][:d], v["decode_tables"][:d * w].view(d, w),
                                                       num_splits=self.num_splits_for(d))
                prefill = PrefillMeta(v["cu_q"], v["cu_k"], p, 0, v["prefill_tables"].view(ROWS, w))
                set_context(Context(v["slots"][:t], decode, prefill))
                graph = torch.cuda.CUDAGraph()
                self.outputs[:t] = self.model(v["ids"][:t], v["positions"][:t])  # warm-up
                with torch.cuda.graph(graph, pool):
                    self.outputs[:t] = self.model(v["ids"][:t], v["positions"][:t])
                pool = pool or graph.pool()
                self.graphs[(d, p)] = graph
                torch.cuda.synchronize()
                reset_context()
        return pool

    def fill(self, a, inputs, key: tuple[int, int]) -> int:
        """Write a step into `a` (a numpy view of the host mirror of `buf`); returns the elements to copy."""
        d, p = key
        nd = inputs.num_decodes
        n = len(inputs.input_ids)
        lay, w = self.layout, self.max_blocks
        for name, values in (("ids", inputs.input_ids), ("positions", inputs.positions),
                             ("slots", inputs.slot_mapping)):
            at = lay[name][0]
            a[at:at + nd] = values[:nd]
            a[at + nd:at + d] = -1 if name == "slots" else 0
            a[at + d:at + d + n - nd] = values[nd:]
            a[at + d + n - nd:at + d + p] = -1 if name == "slots" else 0
        at = lay["context_lens"][0]
        a[at:at + nd] = inputs.context_lens or []
        a[at + nd:at + d] = 0
        cu_q, cu_k = inputs.cu_seqlens_q, inputs.cu_seqlens_k
        r = len(cu_q) - 1
        for name, cu in (("cu_q", cu_q), ("cu_k", cu_k)):
            at = lay[name][0]
            a[at:at + r + 1] = cu
            a[at + r + 1:at + ROWS + 1] = cu[-1]  # padding rows: no tokens
        tables = inputs.block_tables
        width = len(tables[0])
        at = lay["decode_tables"][0]
        if nd:
            a[at:at + nd * w].reshape(nd, w)[:, :width] = tables[:nd]
        at = lay["prefill_tables"][0]
        a[at:at + r * w].reshape(r, w)[:, :width] = tables[nd:]
        return lay["prefill_tables"][0] + ROWS * w

    def logits_rows(self, inputs, rows: list[int] | None, key: tuple[int, int]) -> list[int] | None:
        """The step's logits rows (runner.logits_rows, in the step's own token order) in the graph's layout."""
        if rows is None:
            return None
        nd, shift = inputs.num_decodes, key[0] - inputs.num_decodes
        return [i if i < nd else i + shift for i in rows]

    def replay(self, key: tuple[int, int]) -> torch.Tensor:
        self.graphs[key].replay()
        return self.outputs[:key[0] + key[1]]

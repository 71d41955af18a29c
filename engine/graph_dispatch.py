"""Which captured CUDA graph a step replays, if any: the graph sizes and the rules that pick one, in plain Python
(tests run them on the CPU, where no graph is ever captured). The runner captures the graphs
(ModelRunner.capture_cudagraph, engine/mixed_graphs.py) and then holds a GraphDispatch of what it captured.

- A decode step of n rows replays the smallest decode bucket >= n: nano's [1, 2, 4, 8] + multiples of 16 up to
  max_num_seqs (decode_buckets); a larger batch runs eagerly. Small buckets also have a graph of fewer splits
  (short_splits: four at one row, two at two, one from four rows on), replayed while every context is at most
  SHORT_CONTEXT tokens (a few programs per head beat the long contexts' split count there).
- A step with prefill rows replays a mixed graph (only a policy that mixes phases has them: engine/policies.py):
  the smallest (decode rows, prefill tokens) pair that holds it, in at most mixed_graphs.ROWS prefill rows; else
  it runs eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass

from .env_knobs import int_knob

# Decode contexts up to this many tokens run in the one-split graph of a small batch (0: no such graph; the
# variable exists to measure the split path against it, docs/perf.md session 13).
SHORT_CONTEXT = int_knob("LABKIT_DECODE_SHORT_CONTEXT", 512)
if SHORT_CONTEXT < 0:
    raise ValueError(f"LABKIT_DECODE_SHORT_CONTEXT: must be >= 0, got {SHORT_CONTEXT}")
# The splits of that short-context graph at batch 1, fewer as rows add programs (short_splits; 1: one program a KV
# head walks the context). On an H100 (docs/perf.md, session 24, three rounds) 4 took batch 1 to 0.877x the
# one-split time with o_proj merging the parts (LABKIT_DECODE_MERGE_IN_GEMV), and batch 2 (two splits, the merge
# kernel in the PDL chain) to 0.957x; 2 splits 0.950x at one row, 8 0.915x and 16 0.980x (64- and 32-key tiles).
SHORT_SPLITS = int_knob("LABKIT_DECODE_SHORT_SPLITS", 4)
if SHORT_SPLITS not in (1, 2, 4, 8, 16, 32):
    raise ValueError(f"LABKIT_DECODE_SHORT_SPLITS: 1, 2, 4, 8, 16 or 32, got {SHORT_SPLITS}")
# Decode graphs of at most this many rows also run the LM head and draw the tokens (the Gumbel kernel), so a small
# batch's step launches one graph instead of the graph, the LM head and two sampling kernels from Python (0: none).
# On one H200 (docs/perf.md, session 15) 16 drew the same ids and took batch 1 from 0.746 to 0.740 ms a token, batch
# 4 and 16 within 0.3%; on an H100 at session 38's GEMV route (session 39, four rounds) 1 took batch 1 to 0.9918x
# (every round below base's fastest), with every evidence step and logits suite passing under it: the default.
GRAPH_SAMPLE_BS = int_knob("LABKIT_GRAPH_SAMPLE_BS", 1)
if GRAPH_SAMPLE_BS not in (0, 1, 2, 4, 8, 16, 32):
    raise ValueError(f"LABKIT_GRAPH_SAMPLE_BS: 0, 1, 2, 4, 8, 16 or 32, got {GRAPH_SAMPLE_BS}")
# A mixed graph holds at most this many prefill rows (its cu_seqlens are this long).
MIXED_PREFILL_ROWS = 16


def short_splits(bs: int) -> int:
    """The splits of bucket bs's short-context graph: SHORT_SPLITS at one row, divided by the rows (the programs
    a KV head gets stay about the same), at least one."""
    return max(1, SHORT_SPLITS // bs)


def short_graph_splits(bs: int, long_splits: int) -> int | None:
    """The split count of bucket bs's short-context graph, or None when it has none: SHORT_CONTEXT is 0, or its
    long-context graph (long_splits) has no more splits than the short one would."""
    splits = short_splits(bs)
    return splits if SHORT_CONTEXT and long_splits > splits else None


def decode_buckets(max_bs: int) -> list[int]:
    """The decode batch sizes captured for at most `max_bs` rows (nano's list)."""
    return [b for b in [1, 2, 4, 8] if b <= max_bs] + list(range(16, max_bs + 1, 16))


@dataclass(frozen=True)
class GraphDispatch:
    decode: tuple[int, ...] = ()               # decode buckets captured (none: decode steps run eagerly)
    short: frozenset[int] = frozenset()        # those with a one-split graph for short contexts too
    mixed_rows: tuple[int, ...] = ()           # the mixed graphs' decode rows and prefill tokens (none: no mixed
    mixed_tokens: tuple[int, ...] = ()         # graphs, a step with prefill rows runs eagerly)

    def key(self, plan) -> tuple[int, int | None] | None:
        """The graph a plan replays: (decode rows, prefill tokens; None for a decode graph), or None: eagerly."""
        if not len(plan):
            return None  # nothing to run: no graph (the decode bucket of 1 would replay for nothing)

        nd = plan.num_decodes
        if nd < len(plan):
            return self.mixed_key(nd, sum(plan.num_new[nd:]), len(plan) - nd)
        if self.decode and nd <= self.decode[-1]:
            return next(b for b in self.decode if b >= nd), None
        return None

    def mixed_key(self, num_decodes: int, prefill_tokens: int, prefill_rows: int) -> tuple[int, int] | None:
        """The smallest mixed graph that holds such a step, or None (it runs eagerly)."""
        if (not self.mixed_rows or prefill_rows > MIXED_PREFILL_ROWS or num_decodes > self.mixed_rows[-1]
                or prefill_tokens > self.mixed_tokens[-1]):
            return None
        return (next(d for d in self.mixed_rows if d >= num_decodes),
                next(p for p in self.mixed_tokens if p >= prefill_tokens))

    def one_split(self, bucket: int, context_lens: list[int]) -> bool:
        """Does a decode step in `bucket` replay the bucket's one-split graph (every context short)?"""
        return bucket in self.short and max(context_lens) <= SHORT_CONTEXT

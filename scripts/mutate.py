#!/usr/bin/env python
"""Mutation testing of labkit's own checks: do the trace cases and the fast tests notice a one-line bug?

    python scripts/mutate.py                      # every mutation; a table and runs/mutate/mutate.json
    python scripts/mutate.py --only S1 B4         # some of them
    python scripts/mutate.py --list               # the mutations, nothing run
    nohup python scripts/mutate.py > runs/mutate.log 2>&1 &    # all of them take a while on 2 cores

Each mutation replaces one exact piece of one line of the engine (scheduler, block manager, runner,
sampler; the step loop). The script builds a temporary tree like `labkit patch prove` does
(labkit/, tests/, workloads/ from the working copy, engine/ from git HEAD, or as found without git),
checks that everything passes there, then for each mutation, in a fresh copy of that tree:
  1. runs `labkit trace --case NAME --no-expect-changes` for every case in workloads/cases (in one
     Python process, through the CLI entry point; --no-expect-changes because the mutated engine
     differs from nothing git can see, and a moved schedule must count);
  2. runs the fast tests (FAST_TESTS) with pytest;
and prints which cases (with the invariants or expectations that failed) and which tests caught it.
A mutation nothing catches is a SURVIVOR: it needs a new case, expectation or test, unless it changes
no behaviour (EQUIVALENT lists those, with the reason); docs/evidence.md records the list and the score.
Exit 0 when every non-equivalent mutation is caught, 1 otherwise, 2 when the unmutated tree fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAST_TESTS = [
    "tests/test_block_manager.py", "tests/test_sampler.py", "tests/test_scheduler_policy.py",
    "tests/test_graph_fallback.py", "tests/test_graph_inputs.py", "tests/test_engine_numbers.py",
    "tests/test_api.py", "tests/test_async_scheduling.py", "tests/test_scheduler_model.py",
    "tests/test_mixed_graphs.py", "tests/test_step_result.py", "tests/test_invariants_fire.py",
    "tests/test_judges_at_edges.py", "tests/test_bench_compare.py", "tests/test_report.py",
    "tests/test_elementwise_kernels.py", "tests/test_policies.py", "tests/test_step_loop.py",
    "tests/test_batch_plan.py", "tests/test_graph_dispatch.py",
    # (session 12: the new modules' tests)
    "tests/test_kv_events.py", "tests/test_kv_event_stream.py", "tests/test_engine_args.py",
    "tests/test_engine_settings_edges.py", "tests/test_live_trace.py", "tests/test_trace_url_window_edges.py",
    "tests/test_live_window_after_an_abort.py", "tests/test_fp8_kv.py", "tests/test_fp8_kv_edges.py",
    "tests/test_hostile_inputs.py", "tests/test_yaml_names_and_paths.py", "tests/test_lab_results_choice.py",
    "tests/test_planning_ahead.py", "tests/test_step_result_queues.py",
    # (session 13)
    "tests/test_decode_knobs.py",
    # (session 14)
    "tests/test_fp8_dot.py", "tests/test_fused_decode.py",
    # (session 15)
    "tests/test_graph_sampling.py", "tests/test_gumbel_sampler.py",
    # (session 16)
    "tests/test_gemv_spills.py", "tests/test_sampler_bench.py",
    # (session 17)
    "tests/test_bench.py",
    # (session 18)
    "tests/test_fp8_v_transposed.py",
    # (session 19)
    "tests/test_kernel_bounds.py", "tests/test_decode_order.py",
]
CASES_TIMEOUT_S = 900
TESTS_TIMEOUT_S = 1500


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str        # its path in the repository (engine/... or labkit/...)
    old: str         # an exact piece of exactly one line of the file
    new: str
    what: str
    tests: tuple = ()  # test files that guard this module beyond FAST_TESTS (run for this mutation only)


def M(id_, file, old, new, what, tests=()):
    return Mutation(id_, file, old, new, what, tuple(tests))


MUTATIONS = [
    # --- scheduler (engine/scheduler.py) ---------------------------------------------------------------
    M("S1", "engine/scheduler.py", "while self.waiting and len(scheduled) < max_seqs:",
      "while self.waiting and len(scheduled) <= max_seqs:", "prefill takes one sequence more than its seats"),
    M("S2", "engine/scheduler.py", "if remaining < num_tokens and scheduled and not any_chunk:",
      "if remaining <= num_tokens and scheduled and not any_chunk:",
      "a later prompt that exactly fills the budget waits"),
    M("S3", "engine/scheduler.py", "            n = min(num_tokens, remaining)",
      "            n = max(num_tokens, remaining)",
      "a chunk ignores the token budget"),
    M("S4", "engine/scheduler.py", "self.preempt(self.running.pop(), preempted)",
      "self.preempt(self.running.popleft(), preempted)", "preemption takes the head of running, not the tail"),
    M("S5", "engine/scheduler.py", "self.running.extendleft(reversed(scheduled))", "self.running.extend(scheduled)",
      "decode without `rotate` (prefill_first, mixed) rotates served sequences to the tail"),
    M("S6", "engine/scheduler.py", "            self.waiting.appendleft(seq)", "            self.waiting.append(seq)",
      "a preempted sequence goes to the back of waiting"),
    M("S7", "engine/policies.py", "admit=not preempted)", "admit=True)",
      "mixed admits new prompts in a step that preempted"),
    M("S8", "engine/policies.py", "decodes = s.take_decodes(preempted, limit=budget)",
      "decodes = s.take_decodes(preempted)", "mixed decodes ignore the token budget"),
    M("S9", "engine/scheduler.py",
      "if seq.num_completion_tokens == seq.max_tokens or seq.num_tokens >= self.max_model_len:",
      "if seq.num_completion_tokens > seq.max_tokens or seq.num_tokens >= self.max_model_len:",
      "a request stops one token after max_tokens"),
    M("S10", "engine/scheduler.py", "            bm.hash_blocks(seq)\n            if not samples:",
      "            if not samples:", "a step's computed blocks are not hashed when it is scheduled"),
    M("S11", "engine/policies.py", "return bool(self.last_was_prefill and s.running)",
      "return bool(not self.last_was_prefill and s.running)", "balanced alternates the wrong way"),
    M("S12", "engine/scheduler.py", "if token == self.eos and not seq.ignore_eos:", "if token == self.eos:",
      "ignore_eos is ignored"),
    M("S13", "engine/in_flight.py", "    seq.num_cached_tokens = seq.flight.cached_before",
      "    pass", "a discarded row's tokens stay counted as cached (and hashed)"),
    M("S14", "engine/scheduler.py", 'self._finish(seq, "abort", later_rows=seq.flight.rows)',
      'self._finish(seq, "abort", later_rows=0)', "an abort keeps the row a launched step has for it"),
    M("S15", "engine/scheduler.py", "from_previous = [seq.flight.sample_row if seq.pending else -1 for seq in decodes]",
      "from_previous = [-1 for seq in decodes]", "a placeholder input is not read from the step before"),
    M("S16", "engine/scheduler.py", "\n                seq.fill_placeholder(token)\n",
      "\n                seq.fill_placeholder(token)\n                flight.rows += 0\n",
      "(a no-op, to check the harness)"),
    # --- block manager (engine/block_manager.py) ----------------------------------------------------------
    M("B1", "engine/block_manager.py", "for i in range(seq.num_blocks - 1):", "for i in range(seq.num_blocks):",
      "the prefix lookup does not skip the last block"),
    M("B2", "engine/block_manager.py", "return num_cached if len(self.free_block_ids) >= num_new else -1",
      "return num_cached if len(self.free_block_ids) > num_new else -1",
      "a prompt that needs exactly the free blocks waits"),
    M("B3", "engine/block_manager.py", "        self.free_block_ids.append(block_id)",
      "        self.free_block_ids.appendleft(block_id)", "a freed block is reused first (LIFO)"),
    M("B4", "engine/block_manager.py", "        for block_id in reversed(seq.block_table):",
      "        for block_id in seq.block_table:", "blocks are freed first-to-last"),
    M("B5", "engine/block_manager.py", "                block.ref_count += 1", "                block.ref_count = 1",
      "a shared prefix hit sets the ref count instead of adding to it"),
    M("B6", "engine/block_manager.py", "            self.hash_to_block_id[h] = block.block_id", "            pass",
      "a computed block's hash is not registered"),
    M("B7", "engine/block_manager.py", "        if prefix != -1:\n            h.update(prefix",
      "        if False:\n            h.update(prefix",
      "a block's hash does not fold in the previous block's"),
    M("B8", "engine/block_manager.py", "        return max(0, seq.num_blocks - len(seq.block_table))",
      "        return max(0, seq.num_blocks - len(seq.block_table) - 1)",
      "decode never appends the block a new token needs"),
    M("B9", "engine/block_manager.py", "        end = min(seq.num_cached_tokens, seq.num_known_tokens) // bs",
      "        end = seq.num_cached_tokens // bs", "a block is hashed before its placeholder token is known"),
    M("B10", "engine/block_manager.py",
      "            if block_id == -1 or self.blocks[block_id].token_ids != token_ids:",
      "            if block_id == -1:", "the prefix lookup trusts the hash without comparing tokens"),
    M("B11", "engine/block_manager.py", "                    del self.hash_to_block_id[h]\n",
      "                    pass\n", "unhash leaves the hash mapping of a block whose KV is never written"),
    M("B12", "engine/block_manager.py", "                    self.hash_to_block_id[h] = previous\n",
      "                    del self.hash_to_block_id[h]\n",
      "unhash drops a hash instead of giving it back to the block that held it before (a lost prefix hit)"),
    # --- batch plan, runner, mixed graphs -----------------------------------------------------------------
    M("F1", "engine/batch_plan.py",
      "return [s + n == t for s, n, t in zip(self.starts, self.num_new, self.num_tokens)]",
      "return [s + n >= t - 1 for s, n, t in zip(self.starts, self.num_new, self.num_tokens)]",
      "a chunk one token short of its prompt samples"),
    M("F2", "engine/batch_plan.py", 'return "prefill" if self.num_decodes == 0 else "mixed"',
      'return "mixed" if self.num_decodes == 0 else "prefill"', "prefill and mixed phases swapped"),
    M("R1", "engine/runner.py", "slots = [t[p // bs] * bs + p % bs for p, t in zip(positions, tables)]",
      "slots = [t[p // bs] * bs + p % bs + 1 for p, t in zip(positions, tables)]", "decode slots one past"),
    M("R2", "engine/runner.py", "inputs.context_lens = [p + 1 for p in positions]",
      "inputs.context_lens = [p for p in positions]", "decode context excludes the token being decoded"),
    M("R3", "engine/runner.py", "slots.extend(range(table[b] * bs + lo - b * bs, table[b] * bs + hi - b * bs))",
      "slots.extend(range(table[b] * bs + lo - b * bs + 1, table[b] * bs + hi - b * bs + 1))",
      "prefill slots one past"),
    M("R4", "engine/runner.py", "                cu_k.append(cu_k[-1] + end)",
      "                cu_k.append(cu_k[-1] + n)",
      "cu_seqlens_k counts only this step's keys"),
    M("R5", "engine/runner.py", "paged = nd or cu_k[-1] > cu_q[-1] or self.kernels.prefill_block_tables",
      "paged = nd or cu_k[-1] >= cu_q[-1] or self.kernels.prefill_block_tables",
      "prefill block tables sent without a cached prefix"),
    M("R6", "engine/graph_dispatch.py", "return next(b for b in self.decode if b >= nd), None",
      "return next(b for b in self.decode if b > nd), None", "a decode batch takes the next bucket up"),
    M("R7", "engine/runner.py", "return [table + [-1] * (width - len(table)) for table in tables]",
      "return [table + [0] * (width - len(table)) for table in tables]",
      "block tables padded with block 0 instead of -1"),
    M("R8", "engine/runner.py", "rows.append(i if i < nd else end - 1)", "rows.append(i if i < nd else end - 2)",
      "a prefill row's logits come from its second-last token"),
    M("R9", "engine/runner.py", "        ids[:n].copy_(previous[:n])", "        ids[:n].copy_(previous[:n].flip(0))",
      "async scheduling's device ids land in the wrong rows"),
    M("G1", "engine/mixed_graphs.py", '            a[at + nd:at + d] = -1 if name == "slots" else 0',
      '            a[at + nd:at + d] = 0', "a mixed graph's padding decode rows write KV to slot 0"),
    M("G2", "engine/mixed_graphs.py", "nd, shift = inputs.num_decodes, key[0] - inputs.num_decodes",
      "nd, shift = inputs.num_decodes, 0", "a mixed graph's prefill logits rows are read unshifted"),
    # --- sampler (engine/sampler.py) -----------------------------------------------------------------------
    M("P1", "engine/sampler.py", "        scaled = logits / torch.where(is_greedy, 1.0, temperatures).unsqueeze(1)",
      "        scaled = logits", "the sampler drops the temperature"),
    M("P2", "engine/sampler.py", "        is_greedy = temperatures <= 0", "        is_greedy = temperatures < 0",
      "temperature 0 is not greedy"),
    M("P3", "engine/sampler.py", 'return logits.masked_fill(logits < kth, float("-inf"))',
      'return logits.masked_fill(logits <= kth, float("-inf"))', "top-k keeps k - 1"),
    M("P4", "engine/sampler.py", "    drop_sorted = mass_before >= top_ps.unsqueeze(1)",
      "    drop_sorted = mass_before > top_ps.unsqueeze(1)", "top-p keeps a token whose preceding mass reaches top_p"),
    M("P5", "engine/sampler.py", "        return torch.where(is_greedy, logits.argmax(dim=-1), sampled)",
      "        return torch.where(is_greedy, sampled, logits.argmax(dim=-1))", "greedy and sampled rows swapped"),
    M("P6", "engine/sampler.py", "    return 0.0 if t < MIN_TEMPERATURE else min(t, MAX_TEMPERATURE)",
      "    return 0.0 if t <= 0 else min(t, MAX_TEMPERATURE)", "a temperature too small to divide by is not greedy"),
    M("P7", "engine/sampler.py", "+ t * _POS_SALT) & _M63", ") & _M63",
      "a row's noise does not depend on the position it samples"),
    # --- the engine loop (engine/llm.py, engine/step_events.py) -------------------------------------------
    M("L1", "engine/step_loop.py", "        current.after = self.scheduler.snapshot()", "        pass",
      "a step's queue counts are read after the next step was scheduled"),
    M("L4", "engine/step_loop.py", "        if ahead is None or self.executor.replays_graph(ahead.plan):",
      "        if True:",
      "an eager step scheduled ahead is launched before the step before it commits (holds its tokens back)"),
    M("L5", "engine/step_loop.py", "return (not sched.is_finished() and self.executor.replays_graph(current.plan)",
      "return (not sched.is_finished()",
      "a step is scheduled ahead while an eager one runs (requests that arrive meanwhile wait a step more)"),
    M("L6", "engine/step_loop.py",
      "        if engine.before_schedule is not None:\n            engine.before_schedule()",
      "        pass", "the hook before scheduling is never called (a case's `after` request joins a step late)"),
    M("L7", "engine/step_loop.py", "                and not sched.next_is_eager_prefill())", "                )",
      "an eager prefill is planned ahead (requests arriving meanwhile miss it)"),
    M("S17", "engine/policies.py", "return not self._decode_turn(s) and s.head_can_prefill()",
      "return s.head_can_prefill()", "the prefill hint ignores balanced's decode turn"),
    M("L2", "engine/step_loop.py", "        if plan.from_previous is not None:  # the ids",
      "        if False:  # the ids",
      "StepResult keeps the placeholder input ids"),
    M("L3", "engine/step_events.py", "            if after is None:\n                self.open[m]",
      "            if False:\n                self.open[m]",
      "a step's after-state is read once the next step changed it"),
    # --- the elementwise kernels (engine/kernels/elementwise.py) ---------------------------------------------
    M("E1", "engine/kernels/elementwise.py", "        x = (x + r).to(DT)\n", "        x = x + r\n",
      "the residual sum is not rounded to the model dtype"),
    M("E2", "engine/kernels/elementwise.py", "    silu = (gate / (1.0 + tl.exp(-gate))).to(DT).to(tl.float32)",
      "    silu = gate / (1.0 + tl.exp(-gate))", "SiLU's result is not rounded before the product"),
    M("E3", "engine/kernel_choice.py", "fused.silu_and_mul: elementwise.silu_and_mul}[fn]",
      "fused.silu_and_mul: elementwise.rms_norm}[fn]", "the wrong kernel wired in for SiLU*up"),
    # --- the judges (labkit) ----------------------------------------------------------------------------------
    M("J1", "labkit/logits/gates.py", "    status = grade(ratio, OVERALL_PASS, OVERALL_FAIL)",
      "    status = grade(ratio, ROW_PASS, ROW_FAIL)", "the overall logits verdict graded with the per-row factors"),
    M("J2", "labkit/logits/gates.py", "    return \"REVIEW\" if ratio > pass_at else \"PASS\"",
      "    return \"REVIEW\" if ratio > pass_at + 0.1 else \"PASS\"", "a ratio just above the PASS bound still passes"),
    M("J3", "labkit/trace/validate.py", "total <= self.max_batched", "total <= self.max_batched + 1",
      "the budget invariant allows one token over"),
    M("J4", "labkit/report/verify.py",
      "        if not present:\n            v.differ(name, \"listed in the manifest but missing",
      "        if False:\n            v.differ(name, \"listed in the manifest but missing",
      "verify accepts a missing file"),
    M("J5", "labkit/bench/compare.py", "    within = None if iv is None else bool(iv[0] <= 1.0 <= iv[1])",
      "    within = None if iv is None else bool(iv[0] < 1.0 < iv[1])",
      "within noise excludes an interval ending at 1.0"),
    M("J6", "engine/request_limits.py", "        if n > self.max_model_len:", "        if n >= self.max_model_len:",
      "a prompt of exactly max_model_len tokens is refused"),
    # (session 17) what a result records and what a live window may claim
    M("J7", "labkit/bench/compare.py", '    knobs = {"knobs": data["knobs"]} if data.get("knobs") else {}',
      "    knobs = {}", "bench compare ignores the engine knobs: runs on two code paths compared as one"),
    M("J8", "labkit/output.py", '        "knobs": engine_knobs(),', '        "knobs": {},',
      "a result says no knob was set whatever was"),
    M("J9", "labkit/trace/validate.py", "return (self.live and self.steps > 0) or any(",
      "return self.live or any(", "a live window in which no step ran says PASS"),
    # --- session 12: the new modules ------------------------------------------------------------------------
    # policies (engine/policies.py)
    M("N1", "engine/policies.py", "decodes = [] if prefills else s.take_decodes(preempted)",
      "decodes = s.take_decodes(preempted)", "prefill_first decodes in a prefill step (mixes phases)"),
    M("N2", "engine/policies.py", "decodes = s.take_decodes(preempted, rotate=True)",
      "decodes = s.take_decodes(preempted)", "balanced does not rotate served decodes to the tail"),
    M("N3", "engine/policies.py", "prefills = s.take_prefills(s.max_num_seqs - len(decodes), budget - len(decodes),",
      "prefills = s.take_prefills(s.max_num_seqs, budget - len(decodes),",
      "mixed admits prefills past max_num_seqs (decode rows not counted against the seats)"),
    M("N4", "engine/policies.py", "s.max_num_seqs - len(decodes), budget - len(decodes), any_chunk=True,",
      "s.max_num_seqs - len(decodes), budget, any_chunk=True,",
      "mixed prefill chunks ignore the tokens the decodes used"),
    M("N5", "engine/policies.py", '    chunked_row = "last"', '    chunked_row = "first"',
      "mixed declares only the first prefill row may be chunked"),
    M("N6", "engine/policies.py", "        return not self.mixes_phases and s.head_can_prefill()",
      "        return s.head_can_prefill()", "the prefill-alone hint ignores that a policy mixes phases"),
    # step loop (engine/step_loop.py)
    M("N7", "engine/step_loop.py", "        return Scheduled(n, plan, (after.prefix_queries - before.prefix_queries,",
      "        return Scheduled(n, plan, (after.prefix_queries,",
      "a step's prefix queries are the running total, not this step's"),
    M("N8", "engine/step_loop.py", "known = [previous[r] if r >= 0 and previous is not None else t",
      "known = [previous[r] if r > 0 and previous is not None else t",
      "a decode row reading sample row 0 of the step before keeps its placeholder id"),
    M("N9", "engine/step_loop.py", "        return known + plan.input_ids[plan.num_decodes:]",
      "        return known", "a mixed step's prefill input ids are dropped from its StepResult"),
    M("N10", "engine/step_loop.py", "sum(t is None and ok for t, ok in zip(result.token_ids,",
      "sum(t is None for t, ok in zip(result.token_ids,", "wasted rows count prefill rows that sample nothing"),
    M("N11", "engine/step_loop.py", 'self.engine.async_stats["launched_ahead"] += self.queued is not None',
      'self.engine.async_stats["launched_ahead"] += 1', "a step counted as launched ahead when none was"),
    # in flight (engine/in_flight.py)
    M("N12", "engine/in_flight.py", "        self.hash_undo = []", "        pass",
      "a row's hash undo list keeps the entries of the rows before"),
    M("N13", "engine/in_flight.py", "block_manager.unhash(seq, seq.flight.hashed_before)",
      "block_manager.unhash(seq, seq.num_hashed_blocks)", "take_back leaves num_hashed_blocks where the row put it"),
    M("N14", "engine/in_flight.py", "        self.rows += 1", "        self.rows = 1",
      "a second row in flight is not counted"),
    # scheduler snapshot (engine/scheduler_snapshot.py, Scheduler.snapshot)
    M("N15", "engine/scheduler_snapshot.py", "return len(self.waiting_ids), len(self.running_ids), self.free_blocks",
      "return len(self.running_ids), len(self.waiting_ids), self.free_blocks", "waiting and running counts swapped"),
    M("N16", "engine/scheduler.py", "bm.num_free_blocks, bm.num_blocks, bm.prefix_queries, bm.prefix_hits, rows)",
      "bm.num_free_blocks, bm.num_blocks, bm.prefix_hits, bm.prefix_queries, rows)",
      "prefix-cache queries and hits swapped in the snapshot"),
    M("N17", "engine/scheduler.py", "tuple(bm.blocks[b].ref_count for b in held))",
      "tuple(bm.ref_counts(seq)))", "released ref counts read from the blocks the row holds now"),
    # graph dispatch (engine/graph_dispatch.py)
    M("N18", "engine/graph_dispatch.py", "list(range(16, max_bs + 1, 16))", "list(range(16, max_bs, 16))",
      "max_num_seqs itself (a multiple of 16) gets no decode bucket"),
    M("N19", "engine/graph_dispatch.py", "if self.decode and nd <= self.decode[-1]:",
      "if self.decode and nd < self.decode[-1]:", "a batch of exactly the largest bucket runs eagerly"),
    M("N20", "engine/graph_dispatch.py", "prefill_rows > MIXED_PREFILL_ROWS", "prefill_rows >= MIXED_PREFILL_ROWS",
      "a mixed step of exactly 16 prefill rows runs eagerly"),
    M("N21", "engine/graph_dispatch.py", "next(p for p in self.mixed_tokens if p >= prefill_tokens))",
      "next(p for p in self.mixed_tokens if p > prefill_tokens))", "a mixed step takes the next token size up"),
    M("N22", "engine/graph_dispatch.py", "max(context_lens) <= SHORT_CONTEXT", "max(context_lens) < SHORT_CONTEXT",
      "a context of exactly SHORT_CONTEXT leaves the one-split graph"),
    M("N23", "engine/graph_dispatch.py", "return self.mixed_key(nd, sum(plan.num_new[nd:]), len(plan) - nd)",
      "return self.mixed_key(nd, sum(plan.num_new), len(plan) - nd)",
      "a mixed step's prefill tokens count its decode rows too"),
    # FP8 KV (engine/kv_quant.py, its reader engine/backends/torch_ref.py)
    M("N24", "engine/kv_quant.py", "torch.where(y.isnan(), 0.0, y).clamp(-FP8_MAX, FP8_MAX).to(FP8)",
      "torch.where(y.isnan(), 0.0, y).to(FP8)", "quantize does not clamp to +-448 before the e4m3 cast"),
    M("N25", "engine/kv_quant.py", "inv = torch.tensor(1.0 / scale, dtype=torch.float32)",
      "inv = torch.tensor(scale, dtype=torch.float32)", "quantize multiplies by the scale instead of dividing"),
    M("N26", "engine/kv_quant.py",
      "return torch.float16 if model_dtype in (torch.bfloat16, torch.float16) else model_dtype",
      "return torch.bfloat16 if model_dtype in (torch.bfloat16, torch.float16) else model_dtype",
      "FP8 attention's probabilities in bfloat16"),
    M("N27", "engine/kv_quant.py", 'return kv_cache_dtype in ("fp8", "fp8_e4m3")', 'return kv_cache_dtype == "fp8"',
      "fp8_e4m3 (vLLM's other name) keeps a model-dtype pool"),
    M("N28", "engine/backends/torch_ref.py", "_attend(q[qs:qe], ki, vi, scale * k_scale, v_scale=v_scale)",
      "_attend(q[qs:qe], ki, vi, scale, v_scale=v_scale)", "FP8 prefill drops the K scale"),
    M("N29", "engine/backends/torch_ref.py", "        out = out * v_scale", "        out = out",
      "FP8 decode drops the V scale"),
    # KV events of the block manager (engine/block_manager.py)
    M("N30", "engine/block_manager.py", "if previous is None and self.events is not None:",
      "if self.events is not None:", "a hash registered again (another block held it) is stored again"),
    M("N31", "engine/block_manager.py", '("stored", h, None if parent == -1 else parent, token_ids)',
      '("stored", h, parent, token_ids)', "a first block's parent is -1, not None"),
    M("N32", "engine/block_manager.py", '                self.events.append(("removed", block.hash))',
      "                pass", "a block handed out for new content drops its hash silently"),
    M("N33", "engine/block_manager.py", '                        self.events.append(("removed", h))',
      "                        pass", "unhash drops a hash silently"),
    # vLLM's KV-event schema (labkit/serve/kv_events.py)
    M("N34", "labkit/serve/kv_events.py", '"parent_block_hash": parent,', '"parent_block_hash": h,',
      "BlockStored names the block itself as its parent"),
    M("N35", "labkit/serve/kv_events.py", "                    parent = h\n", "                    pass\n",
      "KVMirror gives every hash of a multi-block BlockStored the event's parent"),
    M("N36", "labkit/serve/kv_events.py", "                    self.blocks.pop(h, None)", "                    pass",
      "KVMirror ignores BlockRemoved"),
    M("N37", "labkit/serve/kv_events.py", "for i in range(len(token_ids) // block_size):",
      "for i in range(len(token_ids) // block_size - 1):", "the mirror's prefix match skips the last full block"),
    M("N38", "labkit/serve/kv_events.py", 'self.seq.to_bytes(8, "big")', 'self.seq.to_bytes(8, "little")',
      "the batch sequence number little-endian"),
    # flags <-> Config fields (labkit/engine_args.py)
    M("N39", "labkit/engine_args.py", 'return "--" + field.replace("_", "-")', 'return "--" + field',
      "a field's flag keeps its underscores"),
    M("N40", "labkit/engine_args.py", 'return "--" + _new_name(old.split("/")[0][2:])',
      'return "--" + _new_name(old.split("/")[-1][2:])', "--eager/--graph read as its second name"),
    M("N41", "labkit/engine_args.py", "return {**(defaults or {}), **self.kwargs()}",
      "return {**self.kwargs(), **(defaults or {})}", "a case's engine settings win over the flags given"),
    M("N42", "labkit/engine_args.py", 'return [flag(name) if value else "--no-" + flag(name)[2:]]',
      'return [flag(name) if value else "--no-" + flag(name)]', "a false switch written ---no---field"),
    M("N43", "labkit/engine_args.py", 'if getattr(p, "rich_help_panel", None) in ENGINE_PANELS and p.name in FIELDS}',
      "if p.name in FIELDS}", "a command's own option named as a Config field (--seed) taken as the engine's"),
    M("N44", "labkit/engine_args.py", '"int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")',
      '"int": (lambda v: isinstance(v, int), "an integer")', "true accepted as an integer engine setting"),
    # trace --url (labkit/trace/live.py, labkit/serve/live_trace.py)
    M("N45", "labkit/trace/live.py", 'e.get("event") == "live_state" and e.get("kind") == "close" for e in events',
      'e.get("event") == "live_state" for e in events', "a window without its closing state is accepted"),
    M("N46", "labkit/trace/live.py", "                if problems:", "                if False:",
      "an event that is not schema v1 is recorded"),
    M("N47", "labkit/serve/live_trace.py", '                if a["accepted"]:', "                if True:",
      "a live sequence's tokens include the ones discarded"),
    M("N48", "labkit/serve/live_trace.py", 'q["state"] = ("WAITING", nt, 0, comp, [])',
      'q["state"] = ("WAITING", nt, 0, 0, [])', "a preempted sequence's completion count reset"),
    M("N49", "labkit/serve/live_trace.py", '            self.live.pop(e["seq_id"], None)', "            pass",
      "an aborted sequence stays live"),
    M("N50", "labkit/serve/live_trace.py", '        self.t_ns = e["t_ns"]', "        pass",
      "a window's live_state carries time 0"),
    # YAML inputs (labkit/yamlfile.py)
    M("N51", "labkit/yamlfile.py", "                seen[key] = key_node.start_mark", "                pass",
      "a key given twice is not refused"),
    M("N52", "labkit/yamlfile.py", "a, b = first.line + 1, key_node.start_mark.line + 1",
      "a, b = first.line, key_node.start_mark.line + 1", "a duplicate key's first line off by one"),
    M("N53", "labkit/yamlfile.py", 'if key_node.tag == "tag:yaml.org,2002:merge":', "if False:",
      "a YAML merge key counted as a key"),
    M("N54", "labkit/yamlfile.py", 's.endswith((".yaml", ".yml"))', 's.endswith(".yaml")',
      "a missing NAME.yml looked up as a name"),
    # a lab's results (labkit/report/plan.py, results.py, status.py)
    M("N55", "labkit/report/plan.py", "if w is None and (value is _ABSENT or value is None):",
      "if w is None and value is _ABSENT:", "a null condition does not accept a null value"),
    M("N56", "labkit/report/plan.py", "return EVIDENCE_KINDS.index(have) <= EVIDENCE_KINDS.index(need)",
      "return EVIDENCE_KINDS.index(have) < EVIDENCE_KINDS.index(need)", "a result's exact evidence does not satisfy"),
    M("N57", "labkit/report/plan.py",
      "return all(_accepts(lookup(data, key), want) for key, want in self.match.items())",
      "return any(_accepts(lookup(data, key), want) for key, want in self.match.items())",
      "a slot accepts a result meeting one of its conditions"),
    M("N58", "labkit/report/results.py",
      'kind, fn = _kind("trace live" if command == "trace" and d.get("live") is True else command)',
      'kind, fn = _kind(command)', "a live trace summarised as a case trace"),
    M("N59", "labkit/report/results.py", """    if len(digits.lstrip("-")) > MAX_INT_DIGITS:""",
      "    if len(digits) > MAX_INT_DIGITS:", "a negative integer's sign counted as a digit"),
    M("N60", "labkit/report/status.py",
      "ranked.append(((EVIDENCE_KINDS.index(r.evidence), n, elsewhere), r, differs))",
      "ranked.append(((n, EVIDENCE_KINDS.index(r.evidence), elsewhere), r, differs))",
      "a nearer command line wins over stronger evidence"),
    # Session 13: what the H200's lab plan found (the report's choice of a lab's own result, its archive), the
    # decode sweep's knobs
    M("N61", "labkit/report/status.py",
      "ranked.append(((EVIDENCE_KINDS.index(r.evidence), n, elsewhere), r, differs))",
      "ranked.append(((EVIDENCE_KINDS.index(r.evidence), n, 0), r, differs))",
      "where a result was written no longer breaks a tie: the newest run with the lab's options wins"),
    M("N62", "labkit/report/command_line.py", "int(_place(line) != _place(run))", "int(_place(line) == _place(run))",
      "the run written elsewhere is taken for the lab's own"),
    M("N63", "labkit/report/archive.py", "ARCHIVE_COMPRESSLEVEL = 1", "ARCHIVE_COMPRESSLEVEL = 9",
      "the evidence archive at gzip's slowest level (~1 MB/s on a plan's logits arrays)"),
    M("N64", "engine/kernels/decode_attention.py",
      "knobs = FP8_KNOBS if fp8 else DEFAULTS",
      "knobs = DEFAULTS", "an FP8 pool launched with the bf16 knobs (a sweep of LABKIT_FP8_DECODE times nothing)"),
    # session 14: FP8 tensor-core dot products (a knob), and the batch-1 GEMV's own warps
    M("N65", "engine/kernels/decode_attention.py", "s_scale = (q_s * scale_log2)[:, None]",
      "s_scale = scale_log2 + 0.0 * q_s[:, None]", "q's e4m3 scale left out of the FP8 scores"),
    M("N66", "engine/kernels/decode_attention.py", "FP8_DOT=FP8_DOTS.index(fp8_dot)", "FP8_DOT=0",
      "the fp8_dot knob read and ignored (a sweep of it times the float16 path three times)"),
    M("N67", "engine/kernels/decode_layer.py", "num_warps=_WARPS_ONE_ROW if M == 1 else _WARPS",
      "num_warps=_WARPS_ONE_ROW", "batch 2-16 launched with batch 1's four warps (6.8x slower at 16 on the H200)"),
    M("N68", "engine/kernels/decode_attention.py",
      "acc = acc * alpha[:, None] + tl.trans(tl.dot(tl.trans(v.to(CD))",
      "acc = acc + tl.trans(tl.dot(tl.trans(v.to(CD))", "fp8_dot swap's V^T.p^T added without the running rescale"),
    M("N69", "engine/kernels/decode_layer.py",
      "NORM_CHUNK=min(NORM_CHUNK or k_full, k_full) if M > 1 else k_full,",
      "NORM_CHUNK=min(NORM_CHUNK or k_full, k_full),",
      "the norm chunk taken at batch 1 too (the knob is for 2-16 rows)"),
    M("N70", "engine/kernels/decode_layer.py", "ss += tl.sum(h * h, axis=1)", "ss = tl.sum(h * h, axis=1)",
      "the chunked norm keeps only its last chunk's sum of squares"),
    M("N71", "engine/runner.py",
      "picked = self.drawn if self.drawn is not None else self.sampling(plan, logits)",
      "picked = self.sampling(plan, logits)", "a drawing graph's ids dropped and drawn again after it"),
    M("N72", "engine/runner.py", "if head is not None and self.sampling is self._device_sampling else None",
      "if head is not None else None", "a drawing graph asked to draw for a host-side strategy (teacher forcing)"),
    M("N73", "engine/runner.py", "else head[0][:n].clone()", "else head[0][:n]",
      "a host-side strategy handed the graph's logits, which its next replay overwrites"),
    M("N74", "engine/runner.py", "self.drawn = head[1][:n]", "self.drawn = head[1]",
      "a drawing graph's padding rows handed on as sampled ids"),
    M("N75", "engine/runner.py", "temps[:bs], seeds[:bs] = draw", "temps[:bs], seeds[:bs] = draw[0], draw[0]",
      "a drawing graph's seeds filled from the temperatures"),
    M("N76", "engine/kernels/decode_layer.py", "acc = tl.dot(wc, xt, acc, input_precision=DOT_PRECISION)",
      "acc = tl.dot(wc, xt, input_precision=DOT_PRECISION)", "K in chunks: each chunk's product replaces the sum"),
    M("N77", "engine/kernels/decode_layer.py", "nwc = tl.load(nw_ptr + offs_kc, mask=kc_mask",
      "nwc = tl.load(nw_ptr + kc, mask=kc_mask", "K in chunks: a split range normalised with the first one's weights"),
    M("N78", "engine/kernels/decode_layer.py", "kc_mask = (kc < KS) & (offs_kc < K)", "kc_mask = offs_kc < K",
      "K in chunks: a range's last chunk reads into the next range's columns"),
    M("N79", "engine/kernels/decode_layer.py", "K_CHUNK=min(K_CHUNK, block_k) if M > 1 else 0,",
      "K_CHUNK=min(K_CHUNK, block_k),", "K in chunks at one row too (loses the loads before the PDL wait)"),
    # (N80-N81 were LABKIT_GUMBEL_RNG's, retired with it in session 16)
    M("N82", "engine/kernels/decode_layer.py", 'K_CHUNK = int(os.environ.get("LABKIT_DECODE_K_CHUNK", "128"))',
      'K_CHUNK = int(os.environ.get("LABKIT_DECODE_K_CHUNK", "0"))',
      "the 2-16 row GEMV back to its whole K range by default (the tiles spill: 14x slower on the H200)"),
    M("N83", "engine/kernels/decode_layer.py", "K_CHUNK=min(K_CHUNK, block_k) if M > 1 else 0,",
      "K_CHUNK=min(K_CHUNK, block_k) if M > 16 else 0,", "K in chunks never taken (a tile of rows spills)"),
    # (N84-N85 were LABKIT_DECODE_SPLIT=balance's and LABKIT_DECODE_SILU_ROWS', retired with them in session 17)
    M("N86", "engine/kernels/gumbel_sampler.py", "per_sm = per_sm or PROGRAMS_PER_SM", "per_sm = per_sm or 8",
      "LABKIT_GUMBEL_PER_SM read and ignored"),
    M("N87", "engine/kernels/gumbel_sampler.py",
      "k2 = _mix32(((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) ^ _mix32(seed_lo ^ 0x85EBCA6B))",
      "k2 = _mix32(((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) ^ k1)",
      "hash noise: the second key a function of the first (index 0 one word for every seed under 2^32)"),
    M("N88", "engine/kernels/gumbel_sampler.py", "-_log2_approx(1.0 - v))", "-_log2_approx(v))",
      "hash noise: E from log(v) where v is not small (not an exponential draw)"),
    M("N89", "engine/kernels/gumbel_sampler.py", 'BLOCK=block, HASH=noise == "hash",', 'BLOCK=block, HASH=False,',
      "the noise asked for ignored: Philox always"),
    # (session 18: V keys-contiguous in an FP8 pool, LABKIT_FP8_V_TRANSPOSED)
    M("N90", "engine/kernels/decode_attention.py", "v = tl.load(v_cache_ptr + v_off)",
      "v = tl.load(v_cache_ptr + kv_off)",
      "decode's unmasked V tile read with K's offsets (head_dim-contiguous) from a keys-contiguous pool"),
    M("N91", "engine/kernels/decode_attention.py", "V_T=v_t, FP8_DOT", "V_T=False, FP8_DOT",
      "decode never told that V is keys-contiguous (reads it as K is laid out)"),
    M("N92", "engine/kernels/kv_write.py", "V_T=v_transposed(v_cache),", "V_T=False,",
      "the KV write puts V head_dim-contiguous into a keys-contiguous pool"),
    M("N93", "engine/kernels/kv_write.py", "tl.clamp(tl.where(x == x, x, 0.0), -448.0, 448.0)",
      "tl.clamp(x, -448.0, 448.0)", "the kernel's quantiser keeps no NaN rule (clamp makes a NaN -448)"),
    M("N94", "engine/kv_quant.py", "torch.where(y.isnan(), 0.0, y).clamp(", "y.clamp(",
      "the torch quantiser stores a NaN (a stale NaN row then reaches the next owner's unmasked tiles)"),
    M("N95", "engine/runner.py", "FP8_V_TRANSPOSED and self.kv_dtype == FP8", "FP8_V_TRANSPOSED",
      "the knob transposes a model-dtype pool too (the knob is an FP8 pool's)"),
    M("N96", "engine/kv_layout.py", "v = _keys_contiguous(pool[1]) if v_transposed else pool[1]", "v = pool[1]",
      "read_kv reads a keys-contiguous V as head_dim-contiguous"),
    M("N97", "engine/kernels/prefill_attention.py", "PAGE_TILE: tl.constexpr = V_T and BLOCK_SIZE % BLOCK_N == 0",
      "PAGE_TILE: tl.constexpr = V_T", "prefill reads unmasked whole-page tiles where tiles straddle blocks"),
    M("N98", "engine/kernels/decode_layer.py",
      "(slot % BLOCK_SIZE) * stride_v_row + d[None, :] * stride_v_d, v_new)",
      "(slot % BLOCK_SIZE) * stride_row + d[None, :], v_new)",
      "the fused decode layer writes the newest V head_dim-contiguous into a keys-contiguous pool"),
    M("N99", "engine/kernels/decode_layer.py", "v = tl.load(v_cache_ptr + v_off)",
      "v = tl.load(v_cache_ptr + kv_off)",
      "the fused decode layer's unmasked V tile read with K's offsets"),
    # (session 19: the first tile past a row's end, and the decode launch order)
    M("N100", "engine/kernels/decode_layer.py", "block = tl.load(table + n // BLOCK_SIZE, mask=n < end, other=0)",
      "block = tl.load(table + n // BLOCK_SIZE)",
      "the fused layer's first tile reads a padding row's table entry -1 (an illegal address on the GPU)"),
    M("N101", "engine/runner.py", 'inputs.context_lens, order=t.get("order"))', "inputs.context_lens)",
      "an eager step computes the longest-first order and never hands it to the kernel"),
    M("N102", "engine/runner.py", "a[5 * max_bs:5 * max_bs + bucket] = longest_first(inputs.context_lens, bucket)",
      "a[5 * max_bs:5 * max_bs + bucket] = np.arange(bucket)", "a graph's order left in batch order"),
    M("N103", "engine/backends/triton_attn.py", "v_scale=v_scale, order=ctx.order)", "v_scale=v_scale)",
      "the Triton backend drops the step's order"),
    M("N104", "engine/decode_order.py", "np.argsort(-np.asarray(context_lens", "np.argsort(np.asarray(context_lens",
      "shortest first"),
    M("N105", "engine/runner.py", 'order=gv["order"][:bs] if self.decode_order else None)', "order=None)",
      "a decode graph captured without its order (the step's permutation written and never read)"),
    # --- session 20: the judges, the serving books, the bench's arithmetic (each first a survivor, then a test) ---
    M("N106", "labkit/logits/gates.py", "np.linalg.norm(d, axis=1), np.linalg.norm(t, axis=1)",
      "np.linalg.norm(d, axis=1), np.linalg.norm(x, axis=1)", "rel-L2 over the path's own norm, not the truth's"),
    M("N107", "labkit/logits/anchored.py", "    return dtype_of(col) in gates.LOW_PRECISION or kv_fp8(col)",
      "    return dtype_of(col) in gates.LOW_PRECISION",
      "a float32 path with an FP8 KV cache judged against the float32 floor, without its e4m3 reference"),
    M("N108", "labkit/bench/load_metrics.py", '"total_token_throughput": per_s(in_tokens + out_tokens),',
      '"total_token_throughput": per_s(out_tokens),', "total token throughput leaves out the prompts",
      ["tests/test_bench_load.py"]),
    M("N109", "labkit/bench/load_metrics.py", "(values[k] is not None and values[k] <= ms)",
      "(values[k] is not None and values[k] < ms)", "a request exactly at its SLO bound counted as bad (vLLM: <=)",
      ["tests/test_bench_load.py"]),
    M("N110", "labkit/bench/load_metrics.py", "    if not o.ok:", "    if o.ok is None:",
      "a failed request with a quick first token counted as good", ["tests/test_bench_load.py"]),
    M("N111", "labkit/bench/load.py", "            o.itl_ms.append((now - self.last_ns) / 1e6)",
      "            o.itl_ms.append((now - o.sent_ns) / 1e6)", "bench load's itl measured from the send",
      ["tests/test_bench_load.py"]),
    M("N112", "engine/sampler.py", "    return (_shr(x, 40).float() + 0.5) * (1.0 / (1 << 24))",
      "    return (_shr(x, 40).float()) * (1.0 / (1 << 24))", "a keyed uniform of 0 (infinite Gumbel noise) where the "
      "hash's top bits are 0"),
    M("N113", "labkit/trace/validate.py",
      "        yield s.need(ns == 1 and is_int(nt) and is_int(nc) and nt == nc + 1, ",
      "        yield s.need(ns == 1 and is_int(nt) and is_int(nc), ",
      "decode.shape no longer checks total = cached + 1"),
    M("N114", "labkit/trace/validate.py", "            yield s.need(mq == wq and mk == wk, ",
      "            yield s.need(mq == wq, ", "inputs.max_seqlen no longer checks the key length"),
    M("N115", "labkit/trace/validate.py", "(self.nb is not None and b >= self.nb)]",
      "(self.nb is not None and b > self.nb)]", "a block id equal to the pool's size passes block_table.ids"),
    M("N116", "labkit/bench/profile.py",
      '"kernels_per_decode_token": by_phase["decode"] / tokens if tokens else None,',
      '"kernels_per_decode_token": by_phase["decode"] / len(decode) if tokens else None,',
      "kernels per decode token divided by the steps (equal at batch 1 only)", ["tests/test_bench_profile.py"]),
    M("N117", "labkit/bench/profile.py", "            total += e - end", "            total += e - s",
      "overlapping kernels (PDL) counted twice in a layer's busy time", ["tests/test_bench_profile.py"]),
    M("N118", "labkit/serve/protocol.py", "    if room < 1:", "    if room < 0:",
      "a prompt at max_model_len refused as a bad max_tokens, not as the prompt", ["tests/test_serve.py"]),
    M("N119", "labkit/serve/protocol.py", "max_tokens = room if default_max is None else min(default_max, room)",
      "max_tokens = room if default_max is None else max(default_max, room)",
      "/v1/completions without max_tokens runs to max_model_len instead of 16", ["tests/test_serve.py"]),
    M("N120", "labkit/serve/protocol.py", '("n", body.n != 1, ', '("n", body.n > 1, ', "n=0 served",
      ["tests/test_serve.py"]),
    M("N121", "labkit/serve/protocol.py", '"total_tokens": prompt + completion}', '"total_tokens": completion}',
      "usage.total_tokens leaves out the prompt", ["tests/test_serve.py"]),
    M("N122", "labkit/serve/engine_client.py", "                    itl(now - stream.t_last)",
      "                    itl(now - stream.t_arrival)", "the server's inter-token histogram measured from arrival",
      ["tests/test_serve_books.py"]),
    M("N123", "labkit/serve/engine_client.py", "                m.e2el.observe(now - stream.t_arrival)",
      "                m.e2el.observe(now - (stream.t_first or stream.t_arrival))",
      "the server's e2e latency measured from the first token", ["tests/test_serve_books.py"]),
    M("N124", "scripts/kernel_bench.py", '    if cfg.get("order", DECODE_ORDER) == "longest-first":',
      '    if cfg.get("order") == "longest-first":', "kernel_bench's default row in launch order while the engine "
      "launches longest first", ["tests/test_kernel_bench.py"]),
    M("N125", "labkit/logits/gates.py", "    if not math.isfinite(ratio) or ratio > fail_at:",
      "    if ratio > fail_at:", "grade without its non-finite test"),
    M("N126", "labkit/logits/anchored.py", "                if not math.isfinite(r) or r > worst_ratio:",
      "                if r > worst_ratio:", "the K/V step's worst layer without its non-finite test"),
    M("N127", "labkit/logits/compare.py", "        elif fa[name] != fb[name]:",
      '        elif fa[name] != fb[name] and name != "config.json":',
      "collections read through different config.json files compared as one model", ["tests/test_logits_check.py"]),
    M("N128", "labkit/trace/validate.py", "        where, ok = _where(step, request), expected == actual",
      "        where, ok = _where(step, request), expected == actual or actual is None",
      "an expected field the log leaves out counts as met", ["tests/test_validate.py"]),
    M("N129", "labkit/serve/engine_client.py", "            m.queue_time.observe(waited)",
      "            m.queue_time.observe(0.0)", "the server's queue-time histogram drops the core's measurement",
      ["tests/test_serve_books.py"]),
    M("N130", "engine/config.py",
      "        self.max_model_len = min(self.max_model_len, self.hf_config.max_position_embeddings)",
      "        self.max_model_len = self.max_model_len", "max_model_len past the model's positions (its RoPE table)"),
    M("N131", "engine/config.py", "        if not 0.0 < float(self.gpu_memory_utilization) <= 1.0:",
      "        if not 0.0 <= float(self.gpu_memory_utilization) <= 1.0:", "gpu_memory_utilization 0 accepted"),
    M("N132", "engine/config.py", "            if isinstance(value, int) and value % tp:",
      '            if isinstance(value, int) and value % tp and name != "vocab_size":',
      "a vocabulary two ranks cannot split evenly accepted"),
    M("N133", "labkit/report/verify.py", "        if name in listed:", "        if name in listed and False:",
      "report verify passes a manifest that lists a file twice"),
    M("N134", "labkit/report/verify.py", "        if stated != again:",
      '        if stated != again and again != "PASS":',
      "report verify passes a check.json that claims FAIL over a log that passes"),
    M("N135", "labkit/report/verify.py", "        elif _row_verdicts(again) != _row_verdicts(d):",
      "        elif len(_row_verdicts(again)) != len(_row_verdicts(d)):",
      "report verify compares the count of row statuses, not the statuses"),
    M("N136", "labkit/report/verify.py",
      "math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12))", "math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-12))",
      "report verify's re-judged figures agree to 3 digits instead of 9"),
]

# Mutations that change no behaviour a check could see, and why (they are not counted as survivors).
EQUIVALENT = {
    "N125": "a ratio is never NaN: row_distances gives inf (not NaN) for a non-finite row and every noise is floored "
            "above 0, so a non-finite ratio is +inf, which ratio > fail_at already fails",
    "N126": "as N125: a layer's ratio is finite or +inf, and +inf > worst_ratio holds for any finite worst",
    "S16": "adds 0 to a counter: the harness's control (it must come out EQUIVALENT, never caught)",
    "B10": "defence in depth: a block handed out for new content drops its old hash (_allocate_block), so a hash "
           "hit always has the same tokens; only B10 and that line together break it "
           "(patches/fault-prefix-hit-stale-block.patch)",
    "B11": "defence in depth: unhash also empties the block's tokens, and a lookup compares tokens (B10's line), "
           "so the stale mapping it leaves never hits; only the map's size changes",
    "S8": "under mixed, a sequence is admitted only with a token of the budget left after the decodes, so the "
          "running sequences never outnumber the budget and min(max_num_seqs, budget) never binds (no plan "
          "differed in 2,000 random small-pool mixes)",
    "N13": "take_back always precedes its sequence's finish; the only hash_blocks after it (the release path) stops "
           "at min(cached_before, known) // block_size, which is hashed_before (when the row was opened every token "
           "below cached_before was known: a placeholder is always the token at cached_before), so leaving "
           "num_hashed_blocks higher registers nothing less (same prefix hits and hash table in randomised async "
           "runs with aborts and EOS)",
    "N24": "torch's float -> float8_e4m3fn cast saturates at +-448 by itself (torch 2.13: 464, 1e6 and inf all give "
           "448, on the CPU), so the clamp changes no stored value here; it states the rule the KV-write kernel "
           "follows (tests/test_fp8_kv.py holds that kernel bit-equal to quantize) whatever a torch's cast does",
}

# ----------------------------------------------------------------------------- trees

def build_tree(dest: Path) -> str:
    from labkit.patch_prove import engine_source, make_clean_tree

    source, head = engine_source(ROOT)
    make_clean_tree(ROOT, dest, source)
    # The tests read the patch catalogue and a run's commit: the tree has no .git, so it carries the patches
    # and names its commit the way a `git archive` copy does.
    # test_hostile_inputs also reads docs/serving.md and the notes templates; test_gemv_spills runs a script.
    for folder in ("patches", "docs", "notes", "scripts"):
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, dest / folder)
    if head:
        from labkit.output import ARCHIVED_COMMIT_FILE

        (dest / ARCHIVED_COMMIT_FILE).write_text(head + "\n", encoding="utf-8")
    return f"git HEAD {head[:12]}" if head else "engine/ copied as found (no git)"


def mutate(tree: Path, m: Mutation) -> None:
    path = tree / m.file
    text = path.read_text(encoding="utf-8")
    n = text.count(m.old)
    if n != 1:
        raise ValueError(f"{m.id}: {m.old!r} occurs {n} times in {m.file} (the code changed?)")
    mutated = text.replace(m.old, m.new)
    if path.suffix == ".py":
        # a mutation that does not compile would be "caught" by every check without testing any of them
        try:
            compile(mutated, str(path), "exec")
        except SyntaxError as e:
            raise ValueError(f"{m.id}: the mutated {m.file} does not compile ({e.msg}, line {e.lineno})") from None
    path.write_text(mutated, encoding="utf-8")


def _env(tree: Path, runs: Path, model: str) -> dict:
    from labkit.patch_prove import tree_env

    return tree_env(tree, runs, model)


# ----------------------------------------------------------------------------- checks

def run_cases(tree: Path, work: Path, model: str) -> dict:
    """{case: [what failed, ...]} for the cases that did not PASS (RECORDED counts as passing)."""
    out = work / "cases.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cases-worker", str(out), model]
    try:
        res = subprocess.run(cmd, cwd=tree, env=_env(tree, work / "runs", model), capture_output=True, text=True,
                             timeout=CASES_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"(all cases)": [f"timed out after {CASES_TIMEOUT_S} s"]}
    if not out.is_file():
        return {"(all cases)": [f"worker exited {res.returncode}: {(res.stderr or res.stdout).strip()[-300:]}"]}
    return json.loads(out.read_text())


def cases_worker(out: Path, model: str) -> None:
    """Inside the tree: `labkit trace --case NAME` for every shipped case, through the CLI entry point."""
    import contextlib
    import io

    from labkit import cli
    from labkit.trace.cases import list_cases

    caught = {}
    for name in list_cases():
        dest = Path(os.environ["RUNS_DIR"]) / f"trace-{name}"
        args = ["trace", "--case", name, "--model", model, "--device", "cpu", "-q", "--out", str(dest),
                "--no-expect-changes"]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                cli.main(args)
                code = 0
            except SystemExit as e:
                code = e.code or 0
        if code == 0:
            continue
        try:
            report = json.loads((dest / "check.json").read_text())["report"]
            failed = [c for c in report["checks"] if not c["ok"]]
            names = sorted({c["name"] for c in failed if c["kind"] != "expect"})
            n_exp = sum(c["kind"] == "expect" for c in failed)
            caught[name] = names + ([f"{n_exp} expectation(s)"] if n_exp else [])
        except (OSError, ValueError, KeyError):
            lines = [x for x in buf.getvalue().splitlines() if x.strip()]
            caught[name] = [f"exit {code}: {lines[-1].strip()[:200] if lines else ''}"]
    out.write_text(json.dumps(caught))


def run_tests(tree: Path, work: Path, model: str, extra: tuple = ()) -> list[str]:
    """The fast tests (and a mutation's own `extra` test files) that failed (node ids), or one line saying why none
    could run."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--timeout", "300",
           *FAST_TESTS, *[t for t in extra if t not in FAST_TESTS]]
    try:
        res = subprocess.run(cmd, cwd=tree, env=_env(tree, work / "runs", model), capture_output=True, text=True,
                             timeout=TESTS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [f"(tests timed out after {TESTS_TIMEOUT_S} s)"]
    failed = sorted({line.split()[1] for line in res.stdout.splitlines()
                     if line.startswith(("FAILED ", "ERROR ")) and len(line.split()) > 1})
    if res.returncode not in (0, 1) and not failed:
        return [f"(pytest exited {res.returncode}: {res.stdout.strip()[-200:]})"]
    return failed


def short_test(node: str) -> str:
    return node.removeprefix("tests/").replace(".py::", "::")


def caught_by_summary(r: dict) -> str:
    """A short "caught by" for the docs table: the cases (with their failed invariants) and the tests."""
    parts = []
    for case, what in r["cases"].items():
        inv = [w for w in what if not w.endswith("expectation(s)")]
        parts.append(f"{case} ({', '.join(inv) or 'expectations'})" if inv else f"{case} (expectations)")
    if len(parts) > 3:
        parts = parts[:3] + [f"{len(r['cases']) - 3} more cases"]
    tests = [short_test(t).split("[")[0] for t in r["tests"]]
    tests = list(dict.fromkeys(tests))
    if tests:
        parts.append(", ".join(tests[:2]) + (f" +{len(tests) - 2} tests" if len(tests) > 2 else ""))
    return "; ".join(parts) or "-"


def markdown(data: dict) -> str:
    """The docs/evidence.md table of a result file."""
    lines = ["| id | file | mutation | result | caught by (cases: failed invariants; tests) |",
             "| --- | --- | --- | --- | --- |"]
    for r in data["results"]:
        old, new = (" ".join(r.get(k, "").split()) for k in ("old", "new"))   # two-line pieces on one row
        change = f"`{old}` -> `{new}`".replace("|", "\\|")
        by = r["why"] if r["status"] in ("EQUIVALENT", "NOT APPLICABLE") else caught_by_summary(r)
        lines.append(f"| {r['id']} | {r['file']} | {r['what']}: {change} | {r['status']} | {by} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="mutation ids (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default: runs/mutate/mutate.json)")
    ap.add_argument("--skip-baseline", action="store_true", help="do not check the unmutated tree first")
    ap.add_argument("--markdown", type=Path, metavar="JSON", help="print a result file as a Markdown table")
    ap.add_argument("--cases-worker", nargs=2, metavar=("OUT", "MODEL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cases_worker:
        cases_worker(Path(args.cases_worker[0]), args.cases_worker[1])
        return 0
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    chosen = [m for m in MUTATIONS if not args.only or m.id in args.only]
    if args.list or not chosen:
        for m in MUTATIONS:
            print(f"{m.id:4} {m.file}: {m.what}\n     - {m.old.strip()}\n     + {m.new.strip()}")
        return 0 if chosen else 2
    sys.path.insert(0, str(ROOT))
    from labkit.model import default_model_dir, resolve_model

    model = str(resolve_model(default_model_dir()))
    out = args.out or Path(os.environ.get("RUNS_DIR") or ROOT / "runs") / "mutate" / "mutate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="labkit-mutate-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        source = build_tree(base)
        print(f"tree: checks from {ROOT}, engine from {source}; {len(chosen)} mutation(s)", flush=True)
        if not args.skip_baseline:
            t0 = time.perf_counter()
            cases, tests = run_cases(base, Path(tmp) / "w-base", model), run_tests(base, Path(tmp) / "w-base", model)
            print(f"baseline ({time.perf_counter() - t0:.0f} s): cases failing {cases or 'none'}, "
                  f"tests failing {tests or 'none'}", flush=True)
            if cases or tests:
                print("the unmutated tree does not pass: fix that first", file=sys.stderr)
                return 2
        for m in chosen:
            t0 = time.perf_counter()
            tree = Path(tmp) / f"m-{m.id}"
            shutil.copytree(base, tree)
            try:
                mutate(tree, m)
            except ValueError as e:
                results.append({"id": m.id, "file": m.file, "what": m.what, "status": "NOT APPLICABLE",
                                "why": str(e), "cases": {}, "tests": []})
                print(f"{m.id:4} NOT APPLICABLE: {e}", flush=True)
                continue
            work = Path(tmp) / f"w-{m.id}"
            cases = run_cases(tree, work, model)
            tests = run_tests(tree, work, model, m.tests)
            caught = bool(cases or tests)
            status = "CAUGHT" if caught else ("EQUIVALENT" if m.id in EQUIVALENT else "SURVIVED")
            results.append({"id": m.id, "file": m.file, "old": m.old, "new": m.new, "what": m.what,
                            "status": status, "cases": cases, "tests": tests,
                            "why": EQUIVALENT.get(m.id, ""), "seconds": round(time.perf_counter() - t0)})
            by = "; ".join([f"{c} ({', '.join(v)})" for c, v in cases.items()] + [short_test(t) for t in tests])
            print(f"{m.id:4} {status:10} {m.file}: {m.what}  <- {by or '-'} "
                  f"[{time.perf_counter() - t0:.0f} s]", flush=True)
            shutil.rmtree(tree, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
    counted = [r for r in results if r["status"] in ("CAUGHT", "SURVIVED")]
    caught = sum(r["status"] == "CAUGHT" for r in counted)
    summary = {"mutations": len(results), "caught": caught,
               "survived": [r["id"] for r in results if r["status"] == "SURVIVED"],
               "equivalent": [r["id"] for r in results if r["status"] == "EQUIVALENT"],
               "equivalent_but_caught": [r["id"] for r in results if r["id"] in EQUIVALENT and r["status"] == "CAUGHT"],
               "not_applicable": [r["id"] for r in results if r["status"] == "NOT APPLICABLE"],
               "score": f"{caught}/{len(counted)}", "engine": source, "fast_tests": FAST_TESTS,
               "wall_s": round(time.perf_counter() - t_all)}
    out.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(f"\nscore: {caught} of {len(counted)} behaviour-changing mutations caught; "
          f"survivors {summary['survived'] or 'none'}; equivalent {summary['equivalent'] or 'none'}; "
          f"not applicable {summary['not_applicable'] or 'none'} ({summary['wall_s']} s); {out}")
    return 0 if not summary["survived"] else 1


if __name__ == "__main__":
    sys.exit(main())

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
    # --- session 21's screen (docs/mutation-runs/2026-12-05-session21-screen.md): survivors now caught ----
    M("N137", 'engine/kernels/decode_layer.py',
      '    if USE_PDL:\n        if TRIGGER == 2:\n            tl.extra.cuda.gdc_launch_dependents()\n    pid_n '
      '= tl.program_id(0)',
      '    pid_n = tl.program_id(0)',
      "LABKIT_DECODE_PDL=first never lets the successor launch from the GEMV's start", ['tests/test_pdl_trigger.py']),
    M("N138", 'engine/kernels/decode_layer.py',
      'PDL_TRIGGER = {"late": 0, "early": 1, "first": 2}',
      'PDL_TRIGGER = {"late": 0, "early": 2, "first": 1}',
      "the PDL modes' trigger points swapped (first triggers after the wait, early at the start)",
      ['tests/test_pdl_trigger.py']),
    M("N139", 'engine/kernels/decode_layer.py',
      '        tl.extra.cuda.gdc_wait()\n        if TRIGGER == 1:\n            tl.extra.cuda.gdc_launch_depen'
      'dents()\n\n '
      '   offs_m',
      '        tl.extra.cuda.gdc_wait()\n        if TRIGGER >= 1:\n            tl.extra.cuda.gdc_launch_depen'
      'dents()\n\n '
      '   offs_m',
      'first mode triggers twice (at the start and again after the wait)', ['tests/test_pdl_trigger.py']),
    M("N140", 'labkit/trace/perfetto.py',
      '            if row_kind(s, phase, prompt_len.get(sid)) == "decode":\n                name = "decode"\n '
      '           else:\n                name = "prefill" if a.get("accepted") else "prefill chunk"',
      '            name = phase if phase == "decode" else ("prefill" if a.get("accepted") else "prefill chunk")',
      "perfetto names a mixed step's decode rows prefill", ['tests/test_trace_perfetto_edges.py']),
    M("N141", 'engine/step_result.py',
      'return sum(t is not None for t in self.token_ids)',
      'return len(self.token_ids)',
      "the step's new-token count counts a chunk's row", ['tests/test_step_result.py']),
    M("N142", 'engine/step_result.py',
      'cached = [0 if r is not None else',
      'cached = [s if r is not None else',
      'a finished sequence reports its KV as still written', ['tests/test_step_result.py']),
    M("N143", 'engine/llm.py',
      'return {"waiting": len(now.waiting_ids), "running": len(now.running_ids)',
      'return {"waiting": len(now.running_ids), "running": len(now.waiting_ids)',
      'stats() swaps waiting and running', ['tests/test_api.py']),
    M("N144", 'engine/llm.py',
      '        for ids, sp in zip(encoded, params):\n            self._check_fits(ids, sp)\n',
      '',
      'generate queues the prompts before a later one is refused', ['tests/test_api.py']),
    M("N145", 'engine/llm.py',
      'max_prompt_chars=cfg.max_model_len * self.tokenizer.max_chars_per_token)',
      'max_prompt_chars=cfg.max_model_len)',
      "a text prompt is bounded by max_model_len characters, not tokens' worth", ['tests/test_api.py']),
    M("N146", 'engine/llm.py',
      '        self._loop.launches, self._loop.step_count = loop.launches, loop.step_count\n',
      '',
      'step numbers restart when the sampling strategy is set', ['tests/test_api.py']),
    M("N147", 'engine/llm.py',
      '"async_scheduling": self._loop.overlapped,',
      '"async_scheduling": self.config.async_scheduling,',
      'run_start says async scheduling ran when shape hooks turned it off', ['tests/test_run_start_and_exit.py']),
    M("N148", 'engine/llm.py',
      '"kv_bytes_per_token": self.model_runner.kv_block_bytes // cfg.kvcache_block_size,',
      '"kv_bytes_per_token": self.model_runner.kv_block_bytes,',
      "run_start's kv_bytes_per_token is a block's bytes", ['tests/test_run_start_and_exit.py']),
    M("N149", 'engine/llm.py',
      '        self._loop.drain()  # a step still on the device',
      '        pass  # a step still on the device',
      'exit() leaves the step planned ahead uncommitted (a -1 placeholder token)',
      ['tests/test_run_start_and_exit.py']),
    M("N150", 'engine/tokenizer.py',
      'self._clean_up = bool(config.get("clean_up_tokenization_spaces", False))',
      'self._clean_up = bool(config.get("clean_up_tokenization_spaces", True))',
      'clean_up_tokenization_spaces defaults to true', ['tests/test_tokenizer_settings.py']),
    M("N151", 'engine/tokenizer.py',
      'return max(1, longest) * (1 if tok.normalizer is None else 4)',
      'return max(1, longest)',
      "a normalised text's character bound ignores NFC's 4-to-1 compositions", ['tests/test_tokenizer_settings.py']),
    M("N152", 'engine/tokenizer.py',
      't.get("name") == "default"',
      't.get("name") != "default"',
      'a list of named chat templates takes a non-default one', ['tests/test_tokenizer_settings.py']),
    M("N153", 'engine/tokenizer.py',
      '        if (path / "chat_template.jinja").is_file():',
      '        if False:',
      'chat_template.jinja is ignored', ['tests/test_tokenizer_settings.py']),
    M("N154", 'engine/tokenizer.py',
      'return self.encode(text, add_special_tokens=False) if tokenize else text',
      'return self.encode(text) if tokenize else text',
      "a chat prompt gets the post-processor's special tokens", ['tests/test_tokenizer_settings.py']),
    M("N155", 'engine/tokenizer.py',
      '(" n\'t", "n\'t"),',
      '',
      "clean-up keeps the space before n't", ['tests/test_tokenizer_settings.py']),
    M("N156", 'engine/loader.py',
      'need = [f"{name}:{s}" for s in "qkv"]',
      'need = [f"{name}:{s}" for s in "qk"]',
      "a checkpoint without a layer's v_proj loads", ['tests/test_checkpoint_loading.py']),
    M("N157", 'engine/loader.py',
      'need = [f"{name}:{s}" for s in (0, 1)]',
      'need = [f"{name}:{s}" for s in (0,)]',
      "a checkpoint without a layer's up_proj loads", ['tests/test_checkpoint_loading.py']),
    M("N158", 'engine/loader.py',
      '    if missing:\n',
      '    if missing and len(missing) > 1:\n',
      'a checkpoint missing exactly one tensor loads', ['tests/test_checkpoint_loading.py']),
    M("N159", 'engine/layers/linear.py',
      'param.data.copy_(loaded if self.tp_rank == 0 else torch.zeros_like(loaded))',
      'param.data.copy_(loaded)',
      'row-parallel o_proj adds its bias on every rank', ['tests/test_checkpoint_loading.py']),
    M("N160", 'engine/models/qwen3.py',
      'theta = params.get("rope_theta", 10000.0)',
      'theta = params.get("rope_theta", 1000000.0)',
      "a config without rope_theta rotates with base 1e6, not Transformers' 1e4",
      ['tests/test_checkpoint_loading.py']),
    M("N161", 'engine/models/qwen3.py',
      'bias=getattr(config, "attention_bias", False))\n        self.num_heads',
      'bias=False)\n        self.num_heads',
      'q/k/v biases of an attention_bias model are not built', ['tests/test_checkpoint_loading.py']),
    M("N162", 'engine/model_shapes.py',
      'layer_index = None if name in ("embed_tokens", "lm_head") else layer',
      'layer_index = layer',
      'model_shape events put the embedding and LM head in layer 0', ['tests/test_model_shape_events.py']),
    M("N163", 'labkit/fake_model.py',
      '    return int.from_bytes(digest[:8], "little") >> 1',
      '    return int.from_bytes(digest[:7], "little")',
      "the fake weights' per-tensor seeds change (another model under the same name)",
      ['tests/test_fake_model_identity.py']),
    M("N164", 'labkit/fake_model.py',
      '    if cfg["vocab_size"] < TOKENIZER_VOCAB or cfg["vocab_size"] % 2:',
      '    if cfg["vocab_size"] < TOKENIZER_VOCAB:',
      'an odd vocabulary accepted for a fake preset', ['tests/test_fake_model_identity.py']),
    M("N165", 'labkit/fake_model.py',
      '    "qwen3-0.6b": {"out_gain": 1.0, "qk_norm_mean": 0.5, "qk_norm_spread": 0.125},',
      '    "qwen3-0.6b": {"out_gain": 1.0, "qk_norm_mean": 0.5},',
      "the 0.6b preset's q/k norm spread lost (its config and weights change)",
      ['tests/test_fake_model_identity.py']),
    M("N166", 'labkit/model.py',
      '        if size <= 0 or size > 100 * 2**20:',
      '        if size < 0 or size > 100 * 2**20:',
      'a safetensors header of size 0 read as JSON', ['tests/test_model.py']),
    M("N167", 'labkit/model.py',
      'if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape) \\',
      'if not isinstance(shape, list) or not all(_is_int(d) for d in shape) \\',
      'a negative tensor dimension accepted by model info', ['tests/test_model.py']),
    M("N168", 'labkit/model.py',
      '        if v is not None and not (_is_int(v) and v > 0):',
      '        if v is not None and not (_is_int(v) and v >= 0):',
      'a config dimension of 0 accepted by model info', ['tests/test_model.py']),
    M("N169", 'labkit/model.py',
      '    kv_heads = cfg.get("num_key_value_heads", heads)',
      '    kv_heads = cfg.get("num_key_value_heads")',
      "a config without num_key_value_heads gives no KV size (not MHA's)", ['tests/test_model.py']),
    M("N170", 'labkit/model.py',
      '    if dtype_bytes is None and len(st_dtypes) == 1:',
      '    if dtype_bytes is None and st_dtypes:',
      'the KV size taken from one of several safetensors dtypes', ['tests/test_model.py']),
    M("N171", 'labkit/model.py',
      '        rope_theta = cfg["rope_parameters"].get("rope_theta")',
      '        rope_theta = None',
      'rope_theta from rope_parameters ignored', ['tests/test_model.py']),
    M("N172", 'labkit/model.py',
      '             for f in sorted(path.iterdir()) if f.is_file() and not f.name.startswith(".")]',
      '             for f in sorted(path.iterdir()) if f.is_file()]',
      "hidden files listed among a model's files", ['tests/test_model.py']),
    M("N173", 'labkit/serve/core.py',
      'return [s["waiting"], s["running"], s["free_blocks"], s["num_blocks"], 0, 0, 0]',
      'return [s["waiting"], s["running"], s["num_blocks"], s["free_blocks"], 0, 0, 0]',
      'idle stats message swaps free and total KV blocks (/health, kv usage wrong after idle adds/aborts)',
      ['tests/test_serve_core_books.py']),
    M("N174", 'labkit/serve/core.py',
      'counts["wasted_rows"] - self._ahead_seen[1]]',
      'counts["wasted_rows"]]',
      'wasted async rows reported cumulatively in every step: metric over-counts',
      ['tests/test_serve_core_books.py']),
    M("N175", 'labkit/serve/core.py',
      'row["new_tokens"] = sum(1 for o in step["out"] if o[1] is not None)',
      'row["new_tokens"] = len(step["out"])',
      'step log new_tokens counts rows without a token', ['tests/test_serve_core_books.py']),
    M("N176", 'labkit/serve/http.py',
      'COUNTED = ("/v1/completions", "/v1/chat/completions", "/v1/models")',
      'COUNTED = ("/v1/completions", "/v1/chat/completions")',
      '/v1/models requests no longer counted in http_requests_total', ['tests/test_serve_http_edges.py']),
    M("N177", 'labkit/serve/http.py',
      'self.metrics.http(path, status or CLIENT_GONE)',
      'self.metrics.http(path, status or 500)',
      'a client gone before any answer counted as 500 instead of 499', ['tests/test_serve_http_edges.py']),
    M("N178", 'labkit/serve/http.py',
      'declared.isdigit() and int(declared) > limit:',
      'declared.isdigit() and int(declared) >= limit:',
      'a body of exactly --max-body-bytes (declared length) refused', ['tests/test_serve_http_edges.py']),
    M("N179", 'labkit/serve/http.py',
      'if size > limit:',
      'if size >= limit:',
      'a streamed body of exactly --max-body-bytes refused', ['tests/test_serve_http_edges.py']),
    M("N180", 'labkit/serve/http.py',
      'include_usage = body.stream_options is not None and body.stream_options.include_usage',
      'include_usage = body.stream_options is not None',
      'usage chunk sent although include_usage is false', ['tests/test_serve_http_edges.py']),
    M("N181", 'labkit/serve/http.py',
      'yield writer.chunk(tail if tail or not writer.chat else None, stream.reason, [])',
      'yield writer.chunk(tail if tail or writer.chat else None, stream.reason, [])',
      'last chat chunk carries empty content instead of no content', ['tests/test_serve_http_edges.py']),
    M("N182", 'labkit/serve/http.py',
      'return JSONResponse({"status": "unhealthy", "error": reason, **body}, status_code=503,',
      'return JSONResponse({"status": "unhealthy", "error": reason, **body}, status_code=500,',
      '/health while draining or dead answers 500 instead of 503', ['tests/test_serve_http_edges.py']),
    M("N183", 'labkit/serve/http.py',
      'headers={"Retry-After": str(EngineClient.RETRY_AFTER_S)} if engine.dead is None else None)',
      'headers={"Retry-After": str(EngineClient.RETRY_AFTER_S)} if engine.dead is not None else None)',
      'Retry-After on /health given when dead, missing while draining', ['tests/test_serve_http_edges.py']),
    M("N184", 'labkit/serve/http.py',
      'kind = {404: "not_found_error"}.get(exc.status_code, "invalid_request_error")',
      'kind = {400: "not_found_error"}.get(exc.status_code, "invalid_request_error")',
      'a 404 (unknown route) typed invalid_request_error', ['tests/test_serve_http_edges.py']),
    M("N185", 'labkit/serve/http.py',
      'return {"count": len(ids), "max_model_len"',
      'return {"count": len(ids) - 1, "max_model_len"',
      '/tokenize count one less than the tokens', ['tests/test_serve_http_edges.py']),
    M("N186", 'labkit/serve/http.py',
      '"max_model_len": max_len}]}',
      '"max_model_len": None}]}',
      '/v1/models drops max_model_len', ['tests/test_serve_http_edges.py']),
    M("N187", 'labkit/serve/stream_hub.py',
      'if last is not None and n > last + 1:',
      'if last is not None and n > last:',
      'hub counts a missed record for every record received', ['tests/test_step_stream_edges.py']),
    M("N188", 'labkit/serve/stream_hub.py',
      'self.metrics.stream_missed.inc(n - last - 1)',
      'self.metrics.stream_missed.inc(n - last)',
      'hub counts one missed record too many per gap', ['tests/test_step_stream_edges.py']),
    M("N189", 'labkit/serve/metrics.py',
      'fam.add_sample("vllm:" + s.name[len("labkit:"):], s.labels',
      'fam.add_sample(s.name, s.labels',
      'vLLM-name metrics keep labkit: sample names', ['tests/test_serve_http_edges.py']),
    M("N190", 'labkit/serve/step_stream.py',
      '"var_prefill_length": max(0.0, self.sumsq / n - mean * mean) if n else 0.0',
      '"var_prefill_length": max(0.0, self.sumsq / n - mean) if n else 0.0',
      'queue book prefill variance subtracts the mean instead of its square', ['tests/test_step_stream_edges.py']),
    M("N191", 'labkit/serve/step_stream.py',
      'prefill_len = [t - (tok is not None) for',
      'prefill_len = [t for',
      'scheduled prefill variance uses lengths after the sampled token', ['tests/test_step_stream_edges.py']),
    M("N192", 'labkit/serve/live_summary.py',
      '        if count >= rank:',
      '        if count > rank:',
      'quantile skips a bucket whose count equals the rank', ['tests/test_step_stream_edges.py']),
    M("N193", 'labkit/serve/live_summary.py',
      'now - self._history[1][0] >= self.window_s',
      'now - self._history[1][0] > self.window_s',
      'live summary window keeps one snapshot too many at the boundary', ['tests/test_step_stream_edges.py']),
    M("N194", 'labkit/serve/client.py',
      'tpot = (e2el - result["ttft_ms"]) / (n - 1) if n > 1',
      'tpot = (e2el - result["ttft_ms"]) / n if n > 1',
      'client TPOT divides by all tokens instead of tokens after the first', ['tests/test_serve_client_numbers.py']),
    M("N195", 'labkit/serve/client.py',
      'n = len(result["token_ids"]) or ((result["usage"] or {}).get("completion_tokens") or 0)',
      'n = len(result["token_ids"]) or ((result["usage"] or {}).get("prompt_tokens") or 0)',
      'client token count falls back to prompt_tokens', ['tests/test_serve_client_numbers.py']),
    M("N196", 'labkit/serve/server.py',
      'hit = d["prefix_hits"] / d["prefix_queries"] if d["prefix_queries"] else 0.0',
      'hit = d["prefix_hits"] / d["prompt_tokens"] if d["prefix_queries"] else 0.0',
      'stats line hit rate divides by prompt tokens instead of prefix queries',
      ['tests/test_serve_client_numbers.py']),
    M("N197", 'labkit/serve/lifecycle.py',
      'slow = [r for r in excess if (r.get("seconds") or 0) > HEALTH_MAX_S]',
      'slow = [r for r in excess if (r.get("seconds") or 0) >= HEALTH_MAX_S]',
      'overload judge fails an excess answer of exactly HEALTH_MAX_S', ['tests/test_serve_lifecycle_bounds.py']),
    M("N198", 'labkit/serve/lifecycle.py',
      's.get("finish_reason") in ("length", "stop")',
      's.get("finish_reason") in ("length",)',
      'a request finished on stop judged abnormal', ['tests/test_serve_lifecycle_bounds.py']),
    M("N199", 'labkit/serve/lifecycle.py',
      '    if gap is not None and gap > GAP_MAX_S:',
      '    if gap is not None and gap >= GAP_MAX_S:',
      'slow-consumer judge fails a gap of exactly GAP_MAX_S', ['tests/test_serve_lifecycle_bounds.py']),
    M("N200", 'labkit/logits/collect.py',
      'if "logits" not in arrays or arrays["logits"].shape[0] != len(meta.get("rows", [])):',
      'if "logits" not in arrays or arrays["logits"].shape[0] > len(meta.get("rows", [])):',
      'collection with fewer logits rows than rows accepted', ['tests/test_logits_collect_edges.py']),
    M("N201", 'labkit/logits/collect.py',
      'return p.with_suffix("") if p.suffix in (".json", ".npz") else p',
      'return p.with_suffix("") if p.suffix in (".json",) else p',
      'a collection named by its .npz path is not found', ['tests/test_logits_collect_edges.py']),
    M("N202", 'labkit/logits/suites.py',
      'bad = [t for t in ids if not 0 <= t < vocab_size]',
      'bad = [t for t in ids if not 0 <= t <= vocab_size]',
      'prompt id equal to vocab_size accepted', ['tests/test_logits_collect_edges.py']),
    M("N203", 'labkit/logits/cost.py',
      '    if fp8_d < bound:',
      '    if fp8_d <= bound:',
      'FP8 engine exactly at the geometric-mean bound fails', ['tests/test_logits_cost_edges.py']),
    M("N204", 'labkit/logits/cost.py',
      '    if ref_cost < DISCERNIBLE:',
      '    if ref_cost <= DISCERNIBLE:',
      'reference cost of exactly DISCERNIBLE not judged (n/a)', ['tests/test_logits_cost_edges.py']),
    M("N205", 'labkit/logits/cost.py',
      'quantised["status"] if quantised["status"] != "n/a" else "PASS")',
      'quantised["status"] if quantised["status"] != "n/a" else "REVIEW")',
      'n/a quantised check makes the cost status REVIEW', ['tests/test_logits_cost_edges.py']),
    M("N206", 'labkit/logits/command.py',
      'evidence = ("gpu-measured" if all(c.meta.get',
      'evidence = ("gpu-measured" if any(c.meta.get',
      'check evidence gpu-measured when any side is', ['tests/test_logits_check_evidence.py']),
    M("N207", 'labkit/trace/tables.py',
      '"cached_after": cached + new if',
      '"cached_after": new if',
      "the terminal table's KV-after-forward drops the cached tokens", ['tests/test_trace_tables_edges.py']),
    M("N208", 'labkit/trace/tables.py',
      '"total": a.get("num_tokens"), "cached": a.get("num_cached_tokens"),\n                "scheduled": s.get',
      '"total": s.get("num_tokens"), "cached": a.get("num_cached_tokens"),\n                "scheduled": s.get',
      'the steps TSV writes the length before the step, not after', ['tests/test_trace_tables_edges.py']),
    M("N209", 'labkit/trace/tables.py',
      '("B" if ra is None else "A")',
      '("A" if ra is None else "B")',
      'trace diff says a step is only in the wrong run', ['tests/test_trace_tables_edges.py']),
    M("N210", 'labkit/trace/tables.py',
      'k not in ("shm_name", "dist_init_addr")',
      'k not in ("shm_name",)',
      'config differences list the per-run dist_init_addr', ['tests/test_trace_tables_edges.py']),
    M("N211", 'labkit/trace/tables.py',
      'f" and {len(reqs) - 4} more"',
      'f" and {len(reqs) - 3} more"',
      'case mismatch miscounts the requests it leaves out', ['tests/test_trace_tables_edges.py']),
    M("N212", 'labkit/trace/perfetto.py',
      'return (t_ns - t0) / 1000.0',
      'return (t_ns - t0) / 1e6',
      'perfetto times are in ms where the format wants us', ['tests/test_trace_perfetto_edges.py']),
    M("N213", 'labkit/trace/perfetto.py',
      'name = "prefill" if a.get("accepted") else "prefill chunk"',
      'name = "prefill chunk" if a.get("accepted") else "prefill"',
      'perfetto names an accepted prefill a chunk and a discarded chunk a prefill',
      ['tests/test_trace_perfetto_edges.py']),
    M("N214", 'labkit/trace/perfetto.py',
      'queued_since[p_sid] = end["t_ns"]',
      'queued_since[p_sid] = start["t_ns"]',
      "a preempted request's wait starts at its step's start, not its end", ['tests/test_trace_perfetto_edges.py']),
    M("N215", 'labkit/trace/perfetto.py',
      '"ts": ts + dur,',
      '"ts": ts,',
      'perfetto marks a finish at the start of its step', ['tests/test_trace_perfetto_edges.py']),
    M("N216", 'labkit/bench/offline.py',
      'else int(rss) * 1024',
      'else int(rss) * 1000',
      'max RSS converted from KiB with 1000, not 1024', ['tests/test_bench_offline_edges.py']),
    M("N217", 'labkit/bench/offline.py',
      '"peak_bytes": max(before["peak_bytes"], during["peak_bytes"])',
      '"peak_bytes": during["peak_bytes"]',
      "a TP worker's peak memory ignores its peak before the timed part", ['tests/test_bench_offline_edges.py']),
    M("N218", 'labkit/bench/offline.py',
      'kwargs.setdefault("enforce_eager", not is_cuda(device))',
      'kwargs["enforce_eager"] = not is_cuda(device)',
      "a workload's enforce_eager is overridden by the device default", ['tests/test_bench_offline_edges.py']),
    M("N219", 'labkit/bench/timing.py',
      'max((t.batch_size for t in decode)',
      'max((t.batch_size for t in times)',
      'the largest decode batch counts prefill steps', ['tests/test_bench_offline_edges.py']),
    M("N220", 'labkit/bench/workloads.py',
      'if all(t < vocab_size',
      'if all(t <= vocab_size',
      'an id equal to vocab_size is not folded', ['tests/test_bench_workloads_edges.py']),
    M("N221", 'labkit/bench/workloads.py',
      'total = w.requests * w.prompt_len.hi',
      'total = w.requests * w.prompt_len.lo',
      'the workload size limit counts the shortest prompt, not the longest', ['tests/test_bench_workloads_edges.py']),
    M("N222", 'labkit/bench/workloads.py',
      'if n > MAX_ROUNDS:',
      'if n >= MAX_ROUNDS:',
      'exactly MAX_ROUNDS repeats are refused', ['tests/test_bench_workloads_edges.py']),
    M("N223", 'labkit/bench/workloads.py',
      'w.scaled_from = self.scaled_from or self.requests',
      'w.scaled_from = self.requests',
      'a workload scaled down twice forgets its full request count (draw no longer a prefix)',
      ['tests/test_bench_workloads_edges.py']),
    M("N224", 'labkit/bench/workloads.py',
      'v.get("rounds", 1), 0)',
      'v.get("rounds", 0), 0)',
      'a warm-up mapping without rounds runs zero rounds', ['tests/test_bench_workloads_edges.py']),
    M("N225", 'labkit/bench/hf.py',
      'key=lambda i: -max_tokens[i]',
      'key=lambda i: max_tokens[i]',
      'the HF baseline batches shortest outputs first', ['tests/test_bench_workloads_edges.py']),
    M("N226", 'labkit/bench/hf.py',
      'return eos[0] if eos else 0',
      'return eos[-1] if eos else 0',
      'the HF pad id falls back to the largest EOS id', ['tests/test_bench_workloads_edges.py']),
    M("N227", 'labkit/bench/hf.py',
      'stop = next((k + 1 for k, t',
      'stop = next((k for k, t',
      "the HF baseline counts a row's output without its EOS token", ['tests/test_bench_workloads_edges.py']),
    M("N228", 'labkit/report/views.py',
      'if n > 1 else format(med, spec)',
      'if n > 2 else format(med, spec)',
      'a spread of two repeats shows the median alone', ['tests/test_report_views_edges.py']),
    M("N229", 'labkit/report/views.py',
      '_get(b, "evidence")} - {"gpu-measured", None}',
      '_get(b, "evidence")} - {"gpu-measured"}',
      'a missing bench side triggers the CPU-evidence note', ['tests/test_report_views_edges.py']),
    M("N230", 'labkit/report/views.py',
      'if any(_num(x) for x in kpt + idle):',
      'if any(_num(x) for x in kpt):',
      'a profile with only the idle share is reported as no GPU profile', ['tests/test_report_views_edges.py']),
    M("N231", 'labkit/report/views.py',
      'if lg.get("verdict") != "PASS":',
      'if lg.get("verdict") == "FAIL":',
      'a REVIEW logits verdict is not explained', ['tests/test_report_views_edges.py']),
    M("N232", 'labkit/report/render.py',
      'key=lambda kv: -kv[1]',
      'key=lambda kv: kv[1]',
      "the report's verdict counts list the rarest first", ['tests/test_report_views_edges.py']),
    M("N233", 'labkit/report/render.py',
      'return (r.git_head or "-")[:10]',
      'return (r.git_head or "-")[:7]',
      "a result's commit is cut to 7 characters", ['tests/test_report_views_edges.py']),
    M("N234", 'labkit/report/render.py',
      'return "prefill_first" if server.get("started") else None',
      'return "prefill_first"',
      'a load run with an unknown server is said to use prefill_first', ['tests/test_report_views_edges.py']),
    M("N235", 'labkit/report/render.py',
      'if any(x.result is None for x in s.slots)]',
      'if all(x.result is None for x in s.slots)]',
      'the how-to lists only labs missing every result', ['tests/test_report_views_edges.py']),
    M("N236", 'labkit/trace/cases.py',
      '        a, b = prompt["range"]\n        return b - a',
      '        a, b = prompt["range"]\n        return b - a + 1',
      "a range prompt's length counts one id too many", ['tests/test_trace_cases_edges.py']),
    M("N237", 'labkit/trace/cases.py',
      'f"{ch[j]}..{ch[k]}" if k > j',
      'f"{ch[j]}..{ch[k]}" if k >= j',
      'a lone position is written a..a', ['tests/test_trace_cases_edges.py']),
    M("N238", 'labkit/trace/cases.py',
      'if limit is not None and count > limit:',
      'if limit is not None and count >= limit:',
      "exactly the step's position limit is refused", ['tests/test_trace_cases_edges.py']),
    M("N239", 'labkit/trace/cases.py',
      'if hi <= RANDOM_LOW:',
      'if hi < RANDOM_LOW:',
      'random prompt ids in a 100-id vocabulary crash instead of being refused', ['tests/test_trace_cases_edges.py']),
    M("N240", 'labkit/trace/cases.py',
      'bad = [t for t in ids if t < 0 or t >= vocab_size]',
      'bad = [t for t in ids if t < 0 or t > vocab_size]',
      'a token id equal to vocab_size is accepted', ['tests/test_trace_cases_edges.py']),
    M("N241", 'labkit/trace/cases.py',
      'declared.max_num_batched_tokens + declared.max_num_seqs',
      'declared.max_num_batched_tokens',
      "a step's position limit leaves out a decode row per sequence", ['tests/test_trace_cases_edges.py']),
    M("N242", 'labkit/trace/events.py',
      '(is_int(e["step"]) and e["step"] >= 1)',
      '(is_int(e["step"]) and e["step"] >= 0)',
      'a step event at step 0 passes the schema', ['tests/test_trace_cases_edges.py']),
    M("N243", 'labkit/trace/events.py',
      't < self._last_t:',
      't <= self._last_t:',
      'two events at one time count as time going backwards', ['tests/test_trace_cases_edges.py']),
    M("N244", 'labkit/trace/events.py',
      'self.finished_at.setdefault(self.rid(a), i)',
      'self.finished_at[self.rid(a)] = i',
      "a request's finish index is its last finished row, not its first", ['tests/test_trace_cases_edges.py']),
    M("N245", 'labkit/report/figures.py',
      '    if abs(x) >= 1000:\n',
      '    if abs(x) > 1000:\n',
      'figure(1000) is written without a thousands separator', ['tests/test_bench_report_texts_edges.py']),
    M("N246", 'labkit/report/figures.py',
      'f"{x:.4g}" if abs(x) >= 1e-3 or x == 0 else',
      'f"{x:.4g}" if abs(x) >= 1e-3 else',
      'a zero figure is written 0.00e+00', ['tests/test_bench_report_texts_edges.py']),
    M("N247", 'labkit/report/figures.py',
      'if len(requests) <= MAX_ROWS:',
      'if len(requests) < MAX_ROWS:',
      'a timeline with exactly MAX_ROWS requests says it cut some', ['tests/test_bench_report_texts_edges.py']),
    M("N248", 'labkit/report/figures.py',
      'str(x.get("phase") or "prefill")',
      'str(x.get("phase") or "decode")',
      'an expected step without a phase is drawn as a decode', ['tests/test_bench_report_texts_edges.py']),
    M("N249", 'labkit/report/figures.py',
      'x <= out[-1][0] + out[-1][1] + 0.1 + 1e-9',
      'x <= out[-1][0] + out[-1][1] + 1e-9',
      'consecutive timeline cells no longer merge into one bar', ['tests/test_bench_report_texts_edges.py']),
    M("N250", 'labkit/bench/command.py',
      'return f"{v:,.{digits}f}" if abs(v) < 1000 else',
      'return f"{v:,.{digits}f}" if abs(v) <= 1000 else',
      'bench figure 1000.0 keeps its decimals', ['tests/test_bench_report_texts_edges.py']),
    M("N251", 'labkit/bench/command.py',
      'f"{n / 2**30:.2f} GiB"',
      'f"{n / 1e9:.2f} GiB"',
      'bench memory in GB labelled GiB', ['tests/test_bench_report_texts_edges.py']),
    M("N252", 'labkit/bench/command.py',
      'if not w.vary_seed and w.repeats > 1:',
      'if not w.vary_seed and w.repeats >= 1:',
      'a single repeat gets the prefix-cache note', ['tests/test_bench_report_texts_edges.py']),
    M("N253", 'labkit/trace/command.py',
      'if st["execution"] == "graph":',
      'if st["execution"] != "eager":',
      'a step with no execution recorded is said to run a CUDA graph', ['tests/test_bench_report_texts_edges.py']),
    M("N254", 'labkit/trace/command.py',
      'elif r["accepted"] is False:',
      'elif not r["accepted"]:',
      "a preempted row's outputs cell says dropped", ['tests/test_bench_report_texts_edges.py']),
    M("N255", 'labkit/trace/run.py',
      '    if device != "auto":\n',
      '    if device == "auto":\n',
      "a traced run ignores --device and keeps the case's device", ['tests/test_trace_run_settings_edges.py']),
    M("N256", 'labkit/trace/run.py',
      'kwargs.update({k: v for k, v in overrides.items() if v is not None})',
      'kwargs.update(overrides)',
      "an option not given (None) erases the case's engine setting", ['tests/test_trace_run_settings_edges.py']),
    M("N257", 'labkit/trace/run.py',
      'if len(files) > 5 else ""',
      'if len(files) >= 5 else ""',
      "exactly five changed engine files are said to have '0 more'", ['tests/test_trace_run_settings_edges.py']),
    M("N258", 'labkit/trace/command.py',
      '    if changed:\n        why.append(how)',
      '    if changed is not None:\n        why.append(how)',
      "an engine known to be HEAD's is a reason to expect changes", ['tests/test_trace_run_settings_edges.py']),
    # (session 21, TC: patch prove, notes, doctor, smoke, shapes, report render and command)
    M("N259", 'labkit/patch.py',
      'verdict = "PASS" if caught == len(proofs) else "FAIL"',
      'verdict = "PASS" if caught else "FAIL"',
      'patch prove PASSes/exit 0 when only some faults are caught', ['tests/test_patch_prove_edges.py']),
    M("N260", 'labkit/patch.py',
      '"fails" if run.rc == 1',
      '"fails" if run.rc == 2',
      "a failing check (exit 1) shown as 'exit 1' not 'fails'", ['tests/test_patch_prove_edges.py']),
    M("N261", 'labkit/patch_prove.py',
      'if len(words) - 1 != CHECK_KINDS[words[0]]:',
      'if len(words) - 1 < CHECK_KINDS[words[0]]:',
      'index check with too many arguments accepted', ['tests/test_patch_prove_edges.py']),
    M("N262", 'labkit/patch_prove.py',
      'if res.returncode not in (0, 1):',
      'if res.returncode not in (0, 1, 2):',
      'a check that exits 2 not reported as could-not-run', ['tests/test_patch_prove_edges.py']),
    M("N263", 'labkit/notes.py',
      'return f"{n} TODO" if n else "written"',
      'return f"{n} TODO" if n > 1 else "written"',
      'note with one TODO shown as written', ['tests/test_notes_edges.py']),
    M("N264", 'labkit/notes.py',
      'for i, q in enumerate(lab.questions, 1):',
      'for i, q in enumerate(lab.questions):',
      'lab note questions numbered from 0', ['tests/test_notes_edges.py']),
    M("N265", 'labkit/doctor.py',
      'if _version_tuple(version) < MIN_TRANSFORMERS:',
      'if _version_tuple(version) <= MIN_TRANSFORMERS:',
      'transformers at exactly the minimum version FAILs', ['tests/test_doctor_edges.py']),
    M("N266", 'labkit/doctor.py',
      'status = PASS if free_gb >= MIN_FREE_DISK_GB else WARN',
      'status = PASS if free_gb > MIN_FREE_DISK_GB else WARN',
      'exactly the minimum free disk WARNs', ['tests/test_doctor_edges.py']),
    M("N267", 'labkit/doctor.py',
      'f"{c[\'PASS\']} PASS, {c[\'WARN\']} WARN, {c[\'FAIL\']} FAIL',
      'f"{c[\'PASS\']} PASS, {c[\'FAIL\']} WARN, {c[\'WARN\']} FAIL',
      'doctor.md swaps the WARN and FAIL counts', ['tests/test_doctor_edges.py']),
    M("N268", 'labkit/smoke.py',
      'check("ids in vocab", bool(token_ids) and not bad,',
      'check("ids in vocab", not bad,',
      "empty generation passes 'ids in vocab'", ['tests/test_smoke_judge_edges.py']),
    M("N269", 'labkit/shapes.py',
      '"all_reduce": 1 + 2 * layers if tp > 1 else 0',
      '"all_reduce": 2 * layers if tp > 1 else 0',
      "all-reduce count drops the embedding's one", ['tests/test_shapes_edges.py']),
    M("N270", 'labkit/shapes.py',
      'if not 1 <= tp <= 8:',
      'if not 1 <= tp < 8:',
      'tensor-parallel size 8 refused', ['tests/test_shapes_edges.py']),
    M("N271", 'labkit/shapes.py',
      'if name == "lm_head.weight" and tied:',
      'if name == "lm_head.weight" and not tied:',
      'tied lm_head counted in per-rank param bytes, untied one not', ['tests/test_shapes_edges.py']),
    M("N272", 'labkit/report/render.py',
      'key=lambda kv: -kv[1]))',
      'key=lambda kv: kv[1]))',
      'labs count line sorted rarest verdict first', ['tests/test_report_render_edges.py']),
    M("N273", 'labkit/report/render.py',
      'if len({p for p, _ in runs}) < 2:',
      'if len({p for p, _ in runs}) < 1:',
      'policy comparison picture drawn for one policy', ['tests/test_report_render_edges.py']),
    M("N274", 'labkit/report/render.py',
      'return "prefill_first" if server.get("started") else None',
      'return "prefill_first" if not server.get("started") else None',
      'default policy credited to servers labkit did not start', ['tests/test_report_render_edges.py']),
    M("N275", 'labkit/report/command.py',
      'weakest = max(kinds, key=EVIDENCE_KINDS.index)',
      'weakest = min(kinds, key=EVIDENCE_KINDS.index)',
      "manifest evidence is the strongest result's, not the weakest", ['tests/test_report_render_edges.py']),
    M("N276", 'labkit/report/command.py',
      'if dest == root or dest in root.parents:',
      'if dest in root.parents:',
      '--out equal to --runs accepted', ['tests/test_report_render_edges.py']),
    M("N277", 'labkit/report/command.py',
      'if current and len(current) + len(group) + 3 > width:',
      'if current and len(current) + len(group) + 3 >= width:',
      'a command line that fits the width is broken anyway', ['tests/test_report_render_edges.py']),
    M("N278", 'labkit/shapes.py',
      '"vocab_ranges": [[r * shard, (r + 1) * shard] for r in range(tp)]',
      '"vocab_ranges": [[r * shard, (r + 1) * shard - 1] for r in range(tp)]',
      'vocab slices lose their last id', ['tests/test_shapes_edges.py']),
    M("N279", 'labkit/report/render.py',
      'if any(x.result is None for x in s.slots)]',
      'if all(x.result is None for x in s.slots)]',
      'how-to lists only labs missing every result', ['tests/test_report_render_edges.py']),
    M("N280", 'labkit/doctor.py',
      'for name in ("config.json", "tokenizer.json") if not',
      'for name in ("config.json",) if not',
      'model folder without tokenizer.json passes', ['tests/test_doctor_edges.py']),
    M("N281", 'labkit/smoke.py',
      "{'PASS' if c.get('passed') else 'FAIL'}",
      "{'FAIL' if c.get('passed') else 'PASS'}",
      'smoke.md marks passed checks FAIL and failed ones PASS', ['tests/test_smoke_judge_edges.py']),
    M("N282", 'labkit/patch_prove.py',
      'c.get("kind") not in ("expect", "policy")]',
      'c.get("kind") not in ("expect",)]',
      'policy-rule failures counted as the invariants a trace proof failed', ['tests/test_patch_prove_edges.py']),
    M("N283", 'labkit/report/command.py',
      'more = f" (and {len(gathered.unreadable) - 1} more)" if len(gathered.unreadable) > 1 else ""',
      'more = f" (and {len(gathered.unreadable) - 1} more)" if len(gathered.unreadable) > 0 else ""',
      "one UNREADABLE file reported with '(and 0 more)'", ['tests/test_report_render_edges.py']),
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

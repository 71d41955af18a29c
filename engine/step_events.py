"""What the engine tells a tracer about each step (schema v1: labkit/trace/events.py). Built only when a
tracer is set, so tracing off costs one `is None` test per hook.

The events observe the plan, the result and the scheduler's snapshots (engine/scheduler_snapshot.py), never
its queues or pool themselves. A step's events go out together, in order, once the step has
committed: before_schedule, preempted, scheduled, gpu_inputs (model_shape during the forward pass), sampled,
after_postprocess. With async scheduling the next step is scheduled before this one commits, so its events
wait, and the state after a step is read when the next one starts scheduling (nothing has changed it yet
but the tokens, which arrive at commit). Two things happen to a step already launched, and are logged in it:
an abort (an `aborted` event after its gpu_inputs) and an EOS learnt after the next step was scheduled
(the sequence is still RUNNING after the step that sampled EOS; its row in the next step is `discarded`).
"""
from __future__ import annotations


class StepEvents:
    def __init__(self, tracer, scheduler, seqs: dict):
        self.tracer = tracer
        self.scheduler = scheduler
        self.seqs = seqs
        self.open: dict[int, tuple] = {}   # launched step -> (plan, its events so far, state after it or None)

    def emit_now(self, event: str, **fields) -> None:
        """An event between steps. With a step still open (launched, not committed: async scheduling) it
        follows that step's events, where it happened in the order of steps."""
        launched = [m for m, (plan, _, _) in self.open.items() if plan is not None]
        if launched:
            self.open[max(launched)][1].append((event, fields, None))
            return
        self.tracer.step = None
        self.tracer.emit(event, **fields)

    def scheduling(self, n: int, now) -> None:
        """Step n is about to be scheduled (`now`: the scheduler's snapshot): what the steps launched before it
        left is final but for tokens."""
        for m, (plan, events, after) in list(self.open.items()):
            if after is None:
                self.open[m] = (plan, events, self._state(plan))
        self.open[n] = (None, [("before_schedule", {
            "waiting": list(now.waiting_ids), "running": list(now.running_ids), "free_blocks": now.free_blocks})], None)

    def launched(self, n: int, plan, inputs) -> None:
        events = self._scheduled(n, plan)
        # nano-vLLM's rule: a prefill has block tables only when it reads a cached prefix (the triton backend
        # is handed them in every prefill).
        tables = inputs.block_tables
        if plan.phase == "prefill" and inputs.cu_seqlens_k[-1] == inputs.cu_seqlens_q[-1]:
            tables = None
        events.append(("gpu_inputs", {
            "num_input_ids": len(inputs.input_ids), "num_decodes": inputs.num_decodes, "positions": inputs.positions,
            "slot_mapping": inputs.slot_mapping, "cu_seqlens_q": inputs.cu_seqlens_q,
            "cu_seqlens_k": inputs.cu_seqlens_k, "max_seqlen_q": inputs.max_seqlen_q,
            "max_seqlen_k": inputs.max_seqlen_k, "context_lens": inputs.context_lens, "block_tables": tables,
            "execution": inputs.execution, "graph_batch": inputs.graph_batch,
            "graph_prefill_tokens": inputs.graph_prefill}))

    def failed(self, n: int, plan) -> None:
        """Step n was scheduled but could not be launched: its schedule goes out now, and nothing more."""
        events = self._scheduled(n, plan)
        del self.open[n]
        self.tracer.step = n
        for event, fields in events:
            self.tracer.emit(event, **fields)

    def _scheduled(self, n: int, plan) -> list:
        _, events, after = self.open[n]
        self.open[n] = (plan, events, after)
        for seq_id in plan.preempted:
            events.append(("preempted", {"seq_id": seq_id, "request_id": self.seqs[seq_id].request_id}))
        events.append(("scheduled", {"phase": plan.phase, "seqs": [
            {"seq_id": i, "request_id": r, "kind": "decode" if row < plan.num_decodes else "prefill",
             "num_tokens": t, "num_cached_tokens": s, "num_scheduled_tokens": k, "block_table": list(b)}
            for row, (i, r, t, s, k, b) in enumerate(zip(plan.seq_ids, plan.request_ids, plan.num_tokens,
                                                          plan.starts, plan.num_new, plan.block_tables))]}))
        return events

    def emit(self, event: str, **fields) -> None:
        """An event fired during the forward pass of the latest launched step (model_shape hooks)."""
        self.open[max(self.open)][1].append((event, fields))

    def aborted(self, seq) -> None:
        fields = {"seq_id": seq.seq_id, "request_id": seq.request_id,
                  "num_completion_tokens": seq.num_completion_tokens,
                  "free_blocks": self.scheduler.snapshot().free_blocks}
        holding = [m for m, (plan, _, _) in self.open.items() if plan is not None and seq.seq_id in plan.seq_ids]
        if holding:  # a launched step has a row for it: the abort happened while that step ran
            self.open[max(holding)][1].append(("aborted", fields))
        else:
            self.emit_now("aborted", **fields)

    def committed(self, n: int, plan, tokens: list, sampled: list[int]) -> None:
        _, events, after = self.open.pop(n)
        entries, free = after if after is not None else self._state(plan)
        discarded = [t is None and ok for t, ok in zip(tokens, plan.samples)]
        sample_rows = plan.sample_rows
        events.append(("sampled", {"tokens": [{"seq_id": plan.seq_ids[i], "token_id": t}
                                              for i, t in zip(sample_rows, sampled)]}))
        for entry, token, gone in zip(entries, tokens, discarded):
            entry["accepted"] = token is not None
            entry["token_id"] = token
            if gone:
                entry["discarded"] = True
        events.append(("after_postprocess", {"seqs": entries, "free_blocks": free}))
        # Events between steps (a request added while this step ran) come after it, with no step.
        between = [e for e in events if len(e) == 3]
        tracer = self.tracer
        tracer.step = n
        for event, fields in (e for e in events if len(e) == 2):
            tracer.emit(event, **fields)
        tracer.step = None
        for event, fields, _ in between:
            tracer.emit(event, **fields)

    def _state(self, plan) -> tuple[list[dict], int]:
        """The plan's sequences as they are now, and the free blocks (the scheduler's snapshot)."""
        now = self.scheduler.snapshot(plan)
        entries = []
        for row, held in zip(now.rows, plan.block_tables):
            entry = {"seq_id": row.seq_id, "request_id": row.request_id, "num_tokens": row.num_tokens,
                     "num_cached_tokens": row.num_cached_tokens, "num_completion_tokens": row.num_completion_tokens,
                     "status": row.status, "block_table": list(row.block_table), "ref_counts": list(row.ref_counts),
                     "finish_reason": row.finish_reason}
            if row.status == "FINISHED":
                # The blocks it just let go of, and who still holds them (0: free, KV and hash kept).
                entry["released_blocks"] = list(held)
                entry["released_ref_counts"] = list(row.held_ref_counts)
            entries.append(entry)
        return entries, now.free_blocks

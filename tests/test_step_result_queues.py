"""A StepResult's queue counts are what the step left: how many requests wait, how many run (engine/
scheduler_snapshot.py's queues), checked against the requests' own states."""
from __future__ import annotations

from engine import LLM, SamplingParams


def test_a_step_reports_the_waiting_and_running_requests_it_left(tiny_model):
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_num_seqs=1, kvcache_block_size=4)
    try:
        ids = [llm.add_request([100 + i] * 6, SamplingParams(max_tokens=3, ignore_eos=True)) for i in range(3)]
        seen = []
        while not llm.is_finished():
            r = llm.step()
            states = [llm.get_sequence(i).status.name for i in ids]
            assert (r.num_waiting, r.num_running) == (states.count("WAITING"), states.count("RUNNING")), r.step
            seen.append((r.num_waiting, r.num_running))
        assert seen[0] == (2, 1) and seen[-1] == (0, 0)
    finally:
        llm.exit()

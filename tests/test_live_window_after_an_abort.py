"""A live server's tracer (labkit/serve/live_trace.py) driven by a real engine: a window opened after a request
was aborted does not hold it live, validates as a whole run would, and the engine exits cleanly with the tracer."""
from __future__ import annotations

from engine import LLM, SamplingParams
from labkit.serve.live_trace import LiveTracer
from labkit.trace.validate import validate


class _Collect:
    def __init__(self):
        self.sent = []

    def publish(self, topic, obj):
        self.sent.append(obj)


def test_a_window_opened_after_an_abort_validates_without_the_aborted_request(tiny_model):
    pub = _Collect()
    tracer = LiveTracer(pub)
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, tracer=tracer, max_num_seqs=4)
    try:
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        ids = [llm.add_request([100 + i] * (4 + 3 * i), params) for i in range(3)]
        for _ in range(2):
            llm.step()
            tracer.flush()
        assert llm.abort(ids[1])
        tracer.open("w")
        while not llm.is_finished():
            llm.step()
            tracer.flush()
        tracer.close("w")
    finally:
        llm.exit()        # (Tracer.close() with no window: nothing raised)
    first = next(i for i, m in enumerate(pub.sent) if m.get("mark") == "w")
    window = [e for m in pub.sent[first:] for e in m["events"]]
    opened = next(e for e in window if e.get("event") == "live_state")
    assert sorted(x["seq_id"] for x in opened["seqs"]) == sorted([ids[0], ids[2]])
    report = validate(window)
    assert report.verdict == "PASS", report.summary()

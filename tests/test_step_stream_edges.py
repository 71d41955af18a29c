"""The step stream's numbers at their edges: the frontend hub's count of records the core's PUB lost (from the gaps
in each topic's counter), the queue book's variance (ForwardPassMetrics' population variance), and the live
summary's window and percentiles (Prometheus' histogram_quantile: the first bucket whose count reaches the rank)."""
from __future__ import annotations

import asyncio

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
pytest.importorskip("prometheus_client")


def test_the_hub_counts_exactly_the_records_missing_from_the_counter_sequence(tmp_path):
    """Records numbered 1, 2, 3, 6, 7, 10 on one topic: 4, 5, 8 and 9 were lost (4 records), the others arrive, and
    a lossless subscriber is ended at the first gap while a plain one carries on."""
    import zmq.asyncio

    from labkit.serve.metrics import ServerMetrics
    from labkit.serve.stream_hub import StreamHub

    async def main():
        actx, pctx = zmq.asyncio.Context(), zmq.Context()
        endpoint = f"ipc://{tmp_path}/hub"
        pub = pctx.socket(zmq.PUB)
        pub.bind(endpoint)

        def send(n: int, step: int) -> None:
            pub.send_multipart([b"step", n.to_bytes(8, "big"), msgpack.packb({"step": step})])

        metrics = ServerMetrics("m")
        hub = StreamHub(actx, endpoint, metrics)
        sub = hub.subscribe(b"step")
        strict = hub.subscribe(b"step", lossless=True)
        # Slow joiner: record 1 again and again (no gap: the same number) until the subscription is through.
        for _ in range(200):
            send(1, 0)
            try:
                await asyncio.wait_for(sub.get(), 0.05)
                break
            except asyncio.TimeoutError:
                pass
        await asyncio.sleep(0.1)
        for s in (sub, strict):
            while not s.queue.empty():
                s.queue.get_nowait()
        # No gap yet: the lossless subscriber gets every record and stays.
        for n in (2, 3):
            send(n, n)
        assert [(await asyncio.wait_for(strict.get(), 5))["step"] for _ in range(2)] == [2, 3]
        assert not strict.dropped and hub.missed == 0
        for n in (6, 7, 10):
            send(n, n)
        got = []
        while len(got) < 5:
            got.append((await asyncio.wait_for(sub.get(), 5))["step"])
        assert got == [2, 3, 6, 7, 10]
        assert hub.missed == 4
        assert metrics.stream_missed._value.get() == 4
        assert strict.dropped and not sub.dropped
        hub.unsubscribe(sub)
        await hub.close()
        pub.close(linger=0)
        pctx.term()
        actx.term()

    asyncio.run(main())


def test_the_queue_books_prefill_variance_is_the_population_variance():
    from labkit.serve.step_stream import QueueBook

    book = QueueBook()
    for n in (2, 4, 9):
        book.added(n)
    m = book.metrics()
    # mean 5; ((2-5)^2 + (4-5)^2 + (9-5)^2) / 3 = 26 / 3
    assert m["num_prefill_requests"] == 3 and m["sum_prefill_tokens"] == 15
    assert m["var_prefill_length"] == pytest.approx(26 / 3)
    book.scheduled(4)
    # [2, 9]: mean 5.5, variance 3.5^2
    assert book.metrics()["var_prefill_length"] == pytest.approx(12.25)
    book.preempted.update({7: 10, 8: 30})
    m = book.metrics()
    assert (m["num_decode_requests"], m["sum_decode_kv_tokens"], m["var_decode_kv_tokens"]) == (2, 40, 100.0)


def test_a_quantile_is_the_first_bucket_whose_count_reaches_the_rank():
    """histogram_quantile: rank q*total; the answer lies in the first bucket whose cumulative count is >= the rank,
    so an empty bucket after it does not move the answer up."""
    from labkit.serve.live_summary import quantile

    inf = float("inf")
    # 2 observations <= 1, none in (1, 2], 2 in (2, 3]: the median (rank 2) is reached at le=1.
    assert quantile(0.5, [(1.0, 2.0), (2.0, 2.0), (3.0, 4.0), (inf, 4.0)]) == 1.0
    # rank 3: in (2, 3], halfway between its counts 2 and 4
    assert quantile(0.75, [(1.0, 2.0), (2.0, 2.0), (3.0, 4.0), (inf, 4.0)]) == 2.5
    # every observation past the last finite bound: that bound
    assert quantile(0.5, [(1.0, 0.0), (inf, 3.0)]) == 1.0


def test_the_summary_window_is_the_last_window_s_seconds_of_snapshots():
    """Snapshots every 5 s with a 10 s window: at t=115 the window starts at the snapshot of t=105 (10 s back), so
    what was observed before t=105 is out of it and window_s says 10."""
    from labkit.serve.live_summary import LiveSummary
    from labkit.serve.metrics import ServerMetrics

    m = ServerMetrics("m")
    summary = LiveSummary(m.registry, window_s=10)
    summary.snapshot(now=100.0)
    for _ in range(7):
        m.ttft.observe(0.3)          # between the snapshots of 100 and 105
    summary.snapshot(now=105.0)
    for _ in range(3):
        m.ttft.observe(0.003)        # between 105 and 110
    summary.snapshot(now=110.0)
    last = summary.snapshot(now=115.0)
    assert last["window_s"] == 10.0
    assert last["ttft_ms"]["count"] == 3
    assert last["ttft_ms"]["p99"] <= 5.0


def test_the_scheduled_prefill_variance_is_over_the_prompt_lengths(tiny_model):
    """A step (scheduling_policy mixed: any prefill row may be chunked) that completes one prompt (100 ids, which
    samples its first token) and chunks another (300 ids under a 256-token budget): ForwardPassMetrics'
    var_prefill_length is the population variance of the scheduled
    requests' prefill lengths, 100 and 300: 100^2 = 10000."""
    from engine import LLM, SamplingParams
    from labkit.serve.step_stream import QueueBook, step_record

    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=512, max_num_batched_tokens=256,
              max_num_seqs=8, scheduling_policy="mixed")
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        llm.add_request(list(range(100, 200)), sp, request_id="short")
        llm.add_request(list(range(300, 600)), sp, request_id="long")
        r = llm.step()
        rec = step_record(r, 0.001, 1, QueueBook(), [0, 0], [])
    finally:
        llm.exit()
    assert rec["rows"]["request_id"] == ["short", "long"] and rec["num_decodes"] == 0
    assert rec["rows"]["new_tokens"] == [100, 156]                 # the long one chunked
    assert rec["rows"]["token_id"][1] is None and rec["rows"]["token_id"][0] is not None
    sched = rec["scheduled_requests"]
    assert sched["num_prefill_requests"] == 2 and sched["sum_prefill_tokens"] == 256
    assert sched["var_prefill_length"] == pytest.approx(10000.0)

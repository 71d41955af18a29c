"""Two `labkit serve` replicas behind a real router, not ours: vllm-router (vLLM's Rust router, from PyPI; the test
extra installs it). It health-checks /health, asks /tokenize for a request's token ids, forwards
/v1/completions and /v1/chat/completions with SGLang's defaults spelled out (skip_special_tokens, no_stop_trim,
...), and its cache_aware policy keeps a prefix on the replica that served it. `labkit bench load --url ROUTER
--behind REPLICAS` runs through it, every request answered; a repeated prefix lands on the replica that holds it
(the prefix-cache hits in that replica's /metrics, none in the other's)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
prometheus_parser = pytest.importorskip("prometheus_client.parser")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[1]


def _router_binary() -> str:
    path = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
    if not Path(path).exists():
        if os.environ.get("CI"):
            pytest.fail("vllm-router is not installed on CI (it is in the test extra)")
        pytest.skip("vllm-router is not installed (pip install vllm-router)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Router:
    def __init__(self, workers: list[str], tmp_path: Path, policy: str = "cache_aware", *extra: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"router-{self.port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([_router_binary(), "--host", "127.0.0.1", "--port", str(self.port),
                                      "--prometheus-port", str(_free_port()), "--worker-urls", *workers,
                                      "--policy", policy, "--worker-startup-check-interval", "1",
                                      "--log-level", "warning", *extra],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < end, "the router did not come up:\n" + self.log()
            time.sleep(0.3)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="module")
def replicas(tiny_model, tmp_path_factory):
    from tests.test_serve import Server

    tmp = tmp_path_factory.mktemp("replicas")
    servers = []
    for _ in range(2):
        kv = f"tcp://127.0.0.1:{_free_port()}"
        servers.append(Server(tiny_model, tmp, "--block-size", "16", "--log-stats-interval", "0",
                              "--vllm-metric-names", "--kv-events", kv))
        servers[-1].kv_events = kv
    yield servers
    for s in servers:
        assert s.stop() == 0, s.log()


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in prometheus_parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _wait_connected(pid: int, port: int, router: Router, timeout: float = 60.0) -> None:
    """Until process `pid` holds an established TCP connection to 127.0.0.1:`port` (its sockets' inodes in
    /proc/PID/fd, their peers in /proc/net/tcp): the router's KV-event subscriber has reached a replica."""
    end = time.monotonic() + timeout
    while True:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            f = line.split()
            if f[9] in inodes and f[3] == "01" and int(f[2].split(":")[1], 16) == port:
                return
        assert time.monotonic() < end, f"the router never connected to the KV events on port {port}:\n" + router.log()
        time.sleep(0.2)


def test_bench_load_through_the_router_answers_every_request_on_both_replicas(replicas, tmp_path):
    router = Router([s.url for s in replicas], tmp_path, "round_robin")
    try:
        before = [_metrics(s.url).get("labkit:request_success_total", 0.0) for s in replicas]
        res = subprocess.run([sys.executable, "-m", "labkit", "bench", "load", "--url", router.url, "--behind",
                              ",".join(s.url for s in replicas), "--workload", "fixed", "--rate", "inf",
                              "--no-warmup", "--out", str(tmp_path / "load.json"), "--json"],
                             cwd=REPO, capture_output=True, text=True, timeout=600)
    finally:
        router.stop()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:] + router.log()[-2000:]
    result = json.loads((tmp_path / "load.json").read_text())
    m = result["metrics"]
    assert m["completed"] == m["requests"] == 16 and m["failed"] == 0
    assert result["config"]["server"] == {"url": router.url, "behind": [s.url for s in replicas]}
    assert result["model"]["config_sha256"] and result["evidence"] == "cpu-executed"
    served = [_metrics(s.url).get("labkit:request_success_total", 0.0) - b for s, b in zip(replicas, before)]
    assert sum(served) == 16 and all(n > 0 for n in served), served   # the router spread them


def test_cache_aware_routing_sends_a_repeated_prefix_to_the_replica_that_holds_it(replicas, tmp_path):
    router = Router([s.url for s in replicas], tmp_path, "cache_aware")
    try:
        before = [_metrics(s.url) for s in replicas]
        prefix = " ".join(f"word{i}" for i in range(120))   # well past the router's 30 % match threshold
        bodies = [{"prompt": f"{prefix} question {k}", "max_tokens": 2} for k in range(6)]
        for body in bodies:
            r = httpx.post(router.url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
        after = [_metrics(s.url) for s in replicas]
    finally:
        router.stop()

    def delta(i: int, name: str) -> float:
        return after[i].get(name, 0.0) - before[i].get(name, 0.0)

    served = [delta(i, "labkit:request_success_total") for i in range(2)]
    hits = [delta(i, "labkit:prefix_cache_hits_total") for i in range(2)]
    holder = served.index(max(served))
    assert served[holder] == 6 and served[1 - holder] == 0, served
    assert hits[holder] >= 5 * 16 and hits[1 - holder] == 0, hits   # every repeat reused the prefix's blocks
    # vLLM's names beside labkit's, with the same values (--vllm-metric-names)
    assert after[holder]["vllm:prefix_cache_hits_total"] == after[holder]["labkit:prefix_cache_hits_total"]
    assert after[holder]["vllm:num_requests_running"] == after[holder]["labkit:num_requests_running"]


def test_tokenize_answers_as_vllm_does(replicas):
    url = replicas[0].url
    r = httpx.post(url + "/tokenize", json={"prompt": "Hello there"}, timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == 1024
    done = httpx.post(url + "/v1/completions", json={"prompt": body["tokens"], "max_tokens": 1,
                                                     "return_token_ids": True}, timeout=60)
    assert done.json()["usage"]["prompt_tokens"] == body["count"]
    chat = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30).json()
    assert chat["count"] > 2
    for bad in ({}, {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, {"prompt": 3}):
        assert httpx.post(url + "/tokenize", json=bad, timeout=30).status_code == 400


def test_kv_aware_routing_reads_our_kv_events_and_follows_the_cache(replicas, tmp_path):
    """vllm-router's kv_aware policy mirrors each replica's prefix cache from its KV events (serve --kv-events, vLLM's
    schema) and the request's token ids (/tokenize). A prefix cached on the second replica by a request sent to it
    directly, past the router, draws the router's requests with that prefix to it: only the events can say so."""
    prefix = " ".join(f"term{i}" for i in range(120))
    holder = replicas[1]
    router = Router([s.url for s in replicas], tmp_path, "kv_aware",
                    *[x for s in replicas for x in ("--kv-event-source", f"{s.url}={s.kv_events}")],
                    "--kv-event-block-size", "16", "--kv-event-model", Path(holder.health()["model"]["path"]).name)
    try:
        # What a replica publishes before the router subscribes is lost (ZeroMQ PUB/SUB; nothing is replayed), and a
        # prefix already cached publishes nothing when it is hit again: warm only once the router is connected.
        for s in replicas:
            _wait_connected(router.proc.pid, int(s.kv_events.rsplit(":", 1)[1]), router)
        time.sleep(1.0)   # (the subscription itself follows the TCP connection)
        assert httpx.post(holder.url + "/v1/completions", json={"prompt": f"{prefix} warm", "max_tokens": 1},
                          timeout=120).status_code == 200
        time.sleep(2.0)   # (the events reach the router's index)
        before = [_metrics(s.url) for s in replicas]
        for k in range(3):
            r = httpx.post(router.url + "/v1/completions", json={"prompt": f"{prefix} q{k}", "max_tokens": 2},
                           timeout=120)
            assert r.status_code == 200, r.text
        after = [_metrics(s.url) for s in replicas]
    finally:
        router.stop()
    served = [after[i].get("labkit:request_success_total", 0) - before[i].get("labkit:request_success_total", 0)
              for i in range(2)]
    assert served == [0, 3], served + [router.log()[-3000:]]
    hits = after[1]["labkit:prefix_cache_hits_total"] - before[1]["labkit:prefix_cache_hits_total"]
    assert hits >= 3 * 16 * 10

"""The rendezvous helpers and the collectives of engine/distributed.py, below any engine (session 22's mutation
screen): the start-up limit, loopback pinning, IPv6 store addresses, the watched store, and all_reduce /
all_reduce_min / broadcast / gather between two real gloo ranks. Light imports only: the two-rank test spawns
a peer that imports this module."""
from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import sys
import time

import pytest
import torch
import torch.distributed as dist

from engine.config import Config, split_host_port
from engine.rendezvous import (
    START_TIMEOUT_FLOOR_S,
    WatchedStore,
    connect_store,
    destroy_group,
    init_group,
    serve_store,
    socket_env,
    start_timeout_s,
)

pytestmark = pytest.mark.timeout(120)


# --- the rendezvous helpers, in this process -----------------------------------------------------------
def test_the_start_up_limit_is_dist_timeout_s_but_never_below_the_floor(tiny_model):
    assert start_timeout_s(Config(tiny_model, dist_timeout_s=5)) == START_TIMEOUT_FLOOR_S
    assert start_timeout_s(Config(tiny_model, dist_timeout_s=START_TIMEOUT_FLOOR_S * 2)) == START_TIMEOUT_FLOOR_S * 2


def _is_loopback_interface(name: str) -> bool:
    with open(f"/sys/class/net/{name}/flags") as f:
        return bool(int(f.read(), 16) & 0x8)


@pytest.mark.skipif(not os.path.isdir("/sys/class/net"), reason="Linux interface flags")
def test_a_loopback_store_pins_the_collectives_to_the_loopback_interface():
    env = socket_env("127.0.0.1:29500")
    assert set(env) == {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"]
    assert _is_loopback_interface(env["GLOO_SOCKET_IFNAME"]), env
    assert socket_env("[::1]:29500") == env
    # Any other address is the user's own network: the collectives pick their interface themselves.
    assert socket_env("192.0.2.7:29500") == {} and socket_env("some-host:29500") == {}


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("addr", ["127.0.0.1:0", pytest.param("[::1]:0", marks=pytest.mark.skipif(
    not _ipv6_loopback(), reason="no IPv6 loopback"))])
def test_the_store_address_handed_to_the_workers_is_a_host_port_they_can_connect_to(addr):
    store, where = serve_store(addr, 2, 10)
    try:
        host, port = split_host_port(where)
        assert port > 0 and host == addr.rpartition(":")[0].strip("[]")
        # An IPv6 host in brackets ("[::1]:PORT", as in a URL), so that the port cannot be read as part of it.
        assert where == (f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        client = connect_store(where, 2, 10)
        client.set("k", "v")
        assert store.get("k") == b"v"
    finally:
        del store


def _hash_store(**keys) -> dist.Store:
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))  # (its own blocking get gives up after this)
    for k, v in keys.items():
        store.set(k, v)
    return store


def test_a_watched_wait_honours_the_timeout_it_is_given():
    watched = WatchedStore(_hash_store(), lambda: None, timeout_s=8)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rendezvous: timed out after 0.2 s waiting for \['missing'\]"):
        watched.wait(["missing"], datetime.timedelta(seconds=0.2))
    assert time.monotonic() - t0 < 5  # not its default of 8 s


class _WorkerDied(Exception):
    pass


def _dies():
    raise _WorkerDied


def test_a_watched_get_of_a_missing_key_looks_at_the_workers_and_unwatch_stops_it():
    watched = WatchedStore(_hash_store(present="1"), _dies, timeout_s=8)
    assert watched.get("present") == b"1"  # a key already there needs no look
    with pytest.raises(_WorkerDied):
        watched.get("missing")
    with pytest.raises(_WorkerDied):
        watched.wait(["missing"], datetime.timedelta(seconds=30))
    watched.unwatch()  # after start-up: waits no longer look at the workers
    with pytest.raises(RuntimeError, match="timed out"):
        watched.wait(["missing"], datetime.timedelta(seconds=0.1))


# --- the collectives between two real ranks ------------------------------------------------------------
def _peer(addr: str, conn) -> None:
    """Rank 1 of a two-rank gloo group: runs the same collectives as the test's rank 0 and reports."""
    from engine import distributed as d

    try:
        init_group("gloo", connect_store(addr, 2, 60), 2, 1, 60)
        d.set_tp(1, 2)
        got = {"min": d.all_reduce_min(3, torch.device("cpu")),
               "sum": d.all_reduce(torch.tensor([10.0, 20.0])).tolist(),
               "bcast": d.broadcast_from_rank0(torch.tensor([9, 9, 9])).tolist(),
               "gather": d.gather_to_rank0(torch.full((2, 3), 1.0), dim=-1)}
        conn.send(got)
    finally:
        destroy_group()


def test_the_collectives_between_two_ranks(monkeypatch):
    from engine import distributed as d

    store, addr = serve_store(None, 2, 60)
    for key, value in socket_env(addr).items():
        monkeypatch.setenv(key, value)  # (inherited by the peer)
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    peer = ctx.Process(target=_peer, args=(addr, theirs), name="screen-peer")
    peer.start()
    hook = sys.excepthook
    try:
        init_group("gloo", store, 2, 0, 60)
        d.set_tp(0, 2)
        smallest = d.all_reduce_min(5, torch.device("cpu"))
        summed = d.all_reduce(torch.tensor([1.0, 2.0])).tolist()
        sent = d.broadcast_from_rank0(torch.tensor([1, 2, 3])).tolist()
        gathered = d.gather_to_rank0(torch.zeros(2, 3), dim=-1)
        assert ours.poll(60)
        theirs_got = ours.recv()
    finally:
        d.set_tp(0, 1)
        destroy_group()
        peer.join(30)
    assert sys.excepthook is hook and not dist.is_initialized()
    assert smallest == theirs_got["min"] == 3  # both ranks agree on the smaller KV block count
    assert summed == theirs_got["sum"] == [11.0, 22.0]
    assert sent == theirs_got["bcast"] == [1, 2, 3]  # rank 0's values everywhere
    assert theirs_got["gather"] is None  # only rank 0 gets the whole
    assert gathered.shape == (2, 6) and gathered[:, :3].eq(0).all() and gathered[:, 3:].eq(1).all()
    assert peer.exitcode == 0


@pytest.mark.parametrize("addr", ["::1:1234", "fe80::1:80", "[::1]", "[::1]:", "::1"])
def test_a_bare_ipv6_address_is_refused_not_split_at_its_last_colon(addr):
    # "::1:1234" is ::1 port 1234 or ::1:1234 with no port: only brackets say which, as in a URL.
    with pytest.raises(ValueError, match=r"expected HOST:PORT or \[IPv6\]:PORT"):
        split_host_port(addr)
    assert split_host_port("[::1]:1234") == ("::1", 1234)
    assert split_host_port("[fe80::1]:80") == ("fe80::1", 80)


def test_without_an_address_the_store_listens_on_loopback_at_a_port_the_kernel_picks():
    stores = [serve_store(None, 2, 10) for _ in range(2)]
    try:
        (h1, p1), (h2, p2) = (split_host_port(where) for _, where in stores)
        assert h1 == h2 == "127.0.0.1"
        assert 1024 <= p1 != p2 >= 1024  # two stores, two free ports: none fixed, none privileged
    finally:
        del stores


def test_an_address_already_listened_on_is_refused_by_name():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    addr = f"127.0.0.1:{taken.getsockname()[1]}"
    try:
        with pytest.raises(ValueError, match=rf"dist_init_addr: {addr} is already in use \(another engine\?\)"):
            serve_store(addr, 2, 10)
    finally:
        taken.close()


def test_the_group_timeout_without_a_group_is_left_alone():
    from engine.rendezvous import set_group_timeout

    assert not dist.is_initialized()
    set_group_timeout(5)  # (before a group is made, or after it is gone: nothing to set, no error)
    assert not dist.is_initialized()

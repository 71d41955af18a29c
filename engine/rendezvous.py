"""How tensor parallel ranks find each other, and how their process group is made and unmade.

- The store. Rank 0 binds the rendezvous socket itself, on loopback (127.0.0.1, a port the kernel picks)
  or on the HOST:PORT given as Config.dist_init_addr, and hands the listening descriptor to
  torch.distributed's TCPStore (master_listen_fd). Left to itself the TCPStore listens on every
  interface, unauthenticated; and choosing a free port first and binding it later would let another
  program take it in between.
- The collectives' own sockets. gloo and NCCL pick a network interface themselves (gloo: whatever the
  host name resolves to). When the store is on loopback, every rank gets GLOO_SOCKET_IFNAME and
  NCCL_SOCKET_IFNAME naming the loopback interface (unless the user set them): the ranks all live on
  this host, so nothing needs to listen anywhere else.
- Start-up time. Spawning a worker, importing torch, joining and loading the model can take long on a
  loaded machine, and a live worker is making progress; so the rendezvous waits up to
  `start_timeout_s(config)` (Config.dist_timeout_s, but at least START_TIMEOUT_FLOOR_S) while every
  worker is alive, and the group's collective timeout becomes Config.dist_timeout_s once the engine
  is up. A dead worker is not waited for: see WatchedStore.
- No traces of a failed start. torch numbers each default group it starts to create
  (`_world.group_count`) and forgets to take the number back when creating it fails; the next
  attempt in the process then looks for its peers under group 1 while fresh workers use group 0, and
  waits out the timeout. `init_group` takes the number back. A successful init also wraps
  sys.excepthook ("[rank0]: " prefixes, one more per engine); `destroy_group` unwraps it.
"""
from __future__ import annotations

import datetime
import errno
import ipaddress
import os
import socket
import sys
import time

import torch.distributed as dist

from .config import split_host_port

START_TIMEOUT_FLOOR_S = 300.0
_IFF_LOOPBACK = 0x8  # linux/if.h
_HOOK_BEFORE_GROUP = None  # sys.excepthook before init_process_group wrapped it


def start_timeout_s(config) -> float:
    return max(float(config.dist_timeout_s), START_TIMEOUT_FLOOR_S)


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def _listen(addr: str | None) -> socket.socket:
    """A socket listening on `addr` (HOST:PORT; port 0: any free one), or on a free loopback port."""
    host, port = ("127.0.0.1", 0) if addr is None else split_host_port(addr)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ValueError(f"dist_init_addr: cannot resolve host {host!r} ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free; a listened one is not
        sock.bind(sockaddr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(f"dist_init_addr: {addr} is already in use (another engine?); leave dist_init_addr "
                             "unset for a free port") from None
        raise ValueError(f"dist_init_addr: cannot listen on {addr} ({exc.strerror})") from None
    return sock


def serve_store(addr: str | None, world: int, timeout_s: float) -> tuple[dist.TCPStore, str]:
    """Rank 0's store, listening only where `addr` says (loopback by default). Returns the store and the
    HOST:PORT the workers should connect to."""
    sock = _listen(addr)
    host, port = sock.getsockname()[:2]
    fd = sock.detach()  # the store owns the descriptor from here on and closes it when it goes
    try:
        store = dist.TCPStore(host, port, world, True, _seconds(timeout_s), wait_for_workers=False,
                              master_listen_fd=fd)
    except BaseException:
        try:
            os.close(fd)
        except OSError:
            pass
        raise
    return store, (f"[{host}]:{port}" if ":" in host else f"{host}:{port}")


def connect_store(addr: str, world: int, timeout_s: float) -> dist.TCPStore:
    host, port = split_host_port(addr)
    return dist.TCPStore(host, port, world, False, _seconds(timeout_s))


def socket_env(addr: str) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for a store on loopback (empty for any other address)."""
    host, _ = split_host_port(addr)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # serve_store returns a numeric host; a name would be the user's own choice
    if not loopback:
        return {}
    name = _loopback_interface()
    return {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}


def _loopback_interface() -> str:
    try:
        for name in sorted(os.listdir("/sys/class/net")):
            with open(f"/sys/class/net/{name}/flags") as f:
                if int(f.read(), 16) & _IFF_LOOPBACK:
                    return name
    except (OSError, ValueError):
        pass
    return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), "lo")


class WatchedStore(dist.Store):
    """Rank 0's view of the store while it joins the group: every blocking wait polls the real store and
    calls `watch()` between polls, which raises as soon as a worker has died. Without it rank 0 would
    sit inside init_process_group (C++, deaf to Ctrl-C too) until the store timeout while gloo waits for
    a dead worker's address. Python store methods run with the GIL, so this is for the rendezvous only:
    `unwatch()` after start-up, and the NCCL path does not use it (NCCL's own threads call the store,
    and rank 0's init_process_group does not wait there: NCCL connects lazily)."""

    POLL_S = 0.02

    def __init__(self, inner: dist.Store, watch, timeout_s: float):
        super().__init__()
        self.inner, self.watch, self.timeout_s = inner, watch, timeout_s

    def unwatch(self) -> None:
        self.watch = None

    def wait(self, keys, timeout=None):
        # gloo passes the group's timeout, which is the start-up limit while joining.
        limit = timeout.total_seconds() if timeout is not None else self.timeout_s
        deadline = time.monotonic() + limit
        while not self.inner.check(keys):
            if self.watch is not None:
                self.watch()
            if time.monotonic() > deadline:
                raise RuntimeError(f"rendezvous: timed out after {limit:g} s waiting for {keys}")
            time.sleep(self.POLL_S)

    def get(self, key):
        self.wait([key])
        return self.inner.get(key)

    def set(self, key, value):
        self.inner.set(key, value)

    def add(self, key, value):
        return self.inner.add(key, value)

    def check(self, keys):
        return self.inner.check(keys)

    def compare_set(self, key, expected, desired):
        return self.inner.compare_set(key, expected, desired)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        self.inner.set_timeout(timeout)


def init_group(backend: str, store: dist.Store, world: int, rank: int, timeout_s: float) -> None:
    """Join the default process group; on failure leave torch as it was before the attempt."""
    global _HOOK_BEFORE_GROUP
    world_state = getattr(dist.distributed_c10d, "_world", None)
    count = getattr(world_state, "group_count", None)
    hook = sys.excepthook
    try:
        dist.init_process_group(backend=backend, store=store, world_size=world, rank=rank,
                                timeout=_seconds(timeout_s))
    except BaseException:
        if count is not None and not dist.is_initialized():
            world_state.group_count = count  # see the module docstring
        raise
    _HOOK_BEFORE_GROUP = hook


def set_group_timeout(timeout_s: float) -> None:
    """The collective timeout from now on (the group was made with the longer start-up limit). A torch
    without `_set_pg_timeout` keeps the start-up limit: slower to report a hung worker, never wrong."""
    set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if set_timeout is not None and dist.is_initialized():
        set_timeout(_seconds(timeout_s))


def destroy_group(abort: bool = False) -> None:
    """Tear down this process's process group; `abort` first for NCCL after a failure (a peer is gone)."""
    global _HOOK_BEFORE_GROUP
    if not dist.is_initialized():
        return
    try:
        if abort and dist.get_backend() == "nccl":
            abort_fn = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if abort_fn is not None:
                try:
                    abort_fn()
                    return
                except Exception:
                    pass
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    finally:
        if _HOOK_BEFORE_GROUP is not None and getattr(sys.excepthook, "__name__", "") == "_distributed_excepthook":
            sys.excepthook = _HOOK_BEFORE_GROUP
        _HOOK_BEFORE_GROUP = None

"""The frontend's end of the engine core's stream socket (step_stream.Publisher): it subscribes to a topic only
while some client wants it, and hands each record to every subscriber's bounded queue. A subscriber whose
queue is full is dropped (its stream ends with a `dropped` event) and counted; nothing waits for it, neither
this reader nor the engine.

    hub = StreamHub(ctx, "ipc://.../stream", metrics)
    sub = hub.subscribe(b"step")        # Subscription: `await sub.get()` -> record, or None once dropped/closed
    ...
    hub.unsubscribe(sub)
"""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("labkit.serve")
# Records a subscriber may have waiting before it is dropped (a second or more of steps on a GPU).
SUBSCRIBER_QUEUE = 1024


class Subscription:
    __slots__ = ("topic", "queue", "dropped", "closed", "lossless")

    def __init__(self, topic: bytes, size: int, lossless: bool = False):
        self.topic = topic
        self.queue: asyncio.Queue = asyncio.Queue(size)
        self.dropped = False   # it fell behind by a whole queue and was let go (or, lossless, missed a record)
        self.closed = False
        self.lossless = lossless  # a gap in the topic's numbering ends it (a live trace must see every event)

    async def get(self):
        """The next record; None once this subscription was dropped (it fell behind) or the hub closed."""
        if self.closed and self.queue.empty():
            return None
        item = await self.queue.get()
        return item

    def _offer(self, item) -> bool:
        try:
            self.queue.put_nowait(item)
            return True
        except asyncio.QueueFull:
            return False

    def _end(self) -> None:
        """No more records: a None for the consumer, in place of what it had not read."""
        self.closed = True
        while True:
            try:
                self.queue.get_nowait()
            except asyncio.QueueEmpty:
                break
        self.queue.put_nowait(None)


class StreamHub:
    def __init__(self, ctx, address: str, metrics, queue_size: int = SUBSCRIBER_QUEUE):
        import zmq

        self._zmq = zmq
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.metrics = metrics
        self.queue_size = queue_size
        self.subs: dict[bytes, set[Subscription]] = {}
        self.last_counter: dict[bytes, int] = {}
        self.missed = 0                    # records the core's PUB dropped before this reader took them
        self.dropped_subscribers = 0
        self._reader: asyncio.Task | None = None
        self._listeners: dict[bytes, list] = {}   # topic -> callbacks run on each record (in the reader)

    def subscribe(self, topic: bytes, queue_size: int | None = None, lossless: bool = False) -> Subscription:
        sub = Subscription(topic, queue_size or self.queue_size, lossless)
        subs = self.subs.setdefault(topic, set())
        if not subs and not self._listeners.get(topic):
            self.sock.setsockopt(self._zmq.SUBSCRIBE, topic)
            self.last_counter.pop(topic, None)   # a fresh subscription: no gap to count before its first record
        subs.add(sub)
        self.metrics.stream_subscribers.set(sum(len(s) for s in self.subs.values()))
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read())
        return sub

    def listen(self, topic: bytes, callback) -> None:
        """Run `callback(record)` on every record of `topic` (in the reader: keep it short)."""
        if not self.subs.get(topic) and not self._listeners.get(topic):
            self.sock.setsockopt(self._zmq.SUBSCRIBE, topic)
        self._listeners.setdefault(topic, []).append(callback)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read())

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self.subs.get(sub.topic, set())
        if sub in subs:
            subs.discard(sub)
            if not subs and not self._listeners.get(sub.topic):
                self.sock.setsockopt(self._zmq.UNSUBSCRIBE, sub.topic)
        sub.closed = True
        self.metrics.stream_subscribers.set(sum(len(s) for s in self.subs.values()))

    async def _read(self) -> None:
        import msgpack

        unpack = msgpack.unpackb
        while any(self.subs.values()) or any(self._listeners.values()):
            try:
                topic, counter, payload = await self.sock.recv_multipart()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the socket closed under us (shutdown)
                return
            n = int.from_bytes(counter, "big")
            last = self.last_counter.get(topic)
            if last is not None and n > last + 1:
                self.missed += n - last - 1
                self.metrics.stream_missed.inc(n - last - 1)
                for sub in [s for s in self.subs.get(topic, ()) if s.lossless]:
                    self._drop(sub)
            self.last_counter[topic] = n
            try:
                record = unpack(payload, raw=False)
            except Exception:  # noqa: BLE001 - a record we cannot read is skipped, not fatal
                log.exception("labkit serve: an unreadable %r record from the engine core", topic)
                continue
            for callback in self._listeners.get(topic, ()):
                callback(record)
            for sub in list(self.subs.get(topic, ())):
                if not sub._offer(record):
                    self._drop(sub)

    def _drop(self, sub: Subscription) -> None:
        sub.dropped = True
        self.dropped_subscribers += 1
        self.metrics.stream_dropped.inc()
        self.unsubscribe(sub)
        sub._end()

    def broadcast(self, topic: bytes, record) -> None:
        """A record made here (the frontend's summary) to every subscriber of `topic`."""
        for sub in list(self.subs.get(topic, ())):
            if not sub._offer(record):
                self._drop(sub)

    async def close(self) -> None:
        for subs in self.subs.values():
            for sub in list(subs):
                sub._end()
        self.subs.clear()
        self._listeners.clear()
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - torn down
                pass
        self.sock.close(linger=0)

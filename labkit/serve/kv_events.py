"""KV cache events in vLLM's schema (`labkit serve --kv-events ENDPOINT`), so a prefix-aware router can mirror
each replica's prefix cache as it mirrors vLLM's (vllm-router's kv_aware policy, Dynamo's and llm-d's indexers).

What goes out, as vLLM's ZmqEventPublisher sends it: a PUB socket bound to ENDPOINT; one multipart message per
engine step that changed the cache, [topic, sequence number (8 bytes, big-endian), msgpack payload]; the
payload a KVEventBatch [ts (Unix seconds), [event, ...]], each event a map tagged with its `type` (vLLM's
msgspec structs, tag=True):

    {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": p | None, "token_ids": [...],
     "block_size": bs, "lora_id": None, "medium": "GPU", "lora_name": None}
    {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU"}
    {"type": "AllBlocksCleared"}                    first, when the server starts: a mirror starts empty

The hashes are the engine's own (engine/block_manager.py: xxh64 over the block's token ids chained through the
previous block's hash, unsigned 64-bit integers; vLLM's wire allows bytes or ints). "GPU" is vLLM's name for the
engine's own KV pool (the CPU's memory when serving on the CPU). The engine records a change whenever a hash
becomes findable by the prefix cache or stops being so (LLMEngine.enable_kv_events / take_kv_events), so
replaying the batches in order rebuilds its hash table's keys exactly (KVMirror does, and a test checks it).
"""
from __future__ import annotations

import time

MEDIUM = "GPU"


def to_vllm(event: tuple, block_size: int) -> dict:
    """One engine event ("stored", hash, parent, token ids) / ("removed", hash) as vLLM's tagged map."""
    if event[0] == "stored":
        _, h, parent, token_ids = event
        return {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent,
                "token_ids": list(token_ids), "block_size": block_size, "lora_id": None, "medium": MEDIUM,
                "lora_name": None}
    if event[0] == "removed":
        return {"type": "BlockRemoved", "block_hashes": [event[1]], "medium": MEDIUM}
    raise ValueError(f"kv events: unknown engine event {event[0]!r}")


def batch(events: list[dict], ts: float | None = None) -> list:
    """vLLM's KVEventBatch: [ts, events] (data_parallel_rank left out, as msgspec omits its default None)."""
    return [time.time() if ts is None else ts, events]


class KVEventPublisher:
    """A PUB socket bound to `endpoint` that sends the engine's KV events as vLLM's batches; never waits (a
    subscriber that falls past the high-water mark loses batches, which the sequence numbers show)."""

    def __init__(self, ctx, endpoint: str, block_size: int, topic: str = "", hwm: int = 100_000):
        import msgpack
        import zmq

        self._zmq = zmq
        self.block_size = block_size
        self.topic = topic.encode()
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.seq = 0

    def send(self, events: list[dict]) -> None:
        self.seq += 1
        try:
            self.sock.send_multipart([self.topic, self.seq.to_bytes(8, "big"), self._pack(batch(events))],
                                     flags=self._zmq.NOBLOCK, copy=False)
        except self._zmq.Again:
            pass

    def cleared(self) -> None:
        self.send([{"type": "AllBlocksCleared"}])

    def publish(self, engine_events: list[tuple]) -> None:
        if engine_events:
            bs = self.block_size
            self.send([to_vllm(e, bs) for e in engine_events])

    def close(self) -> None:
        self.sock.close(linger=0)


class KVMirror:
    """What a router keeps of one replica: its cached block hashes (with each one's parent and token ids),
    rebuilt from the batches alone."""

    def __init__(self):
        self.blocks: dict[int, tuple[int | None, list[int]]] = {}

    def apply(self, payload) -> None:
        """One KVEventBatch, decoded ([ts, events, dp_rank?])."""
        for event in payload[1]:
            kind = event["type"]
            if kind == "BlockStored":  # (vLLM stores several blocks in one event: their token ids one after another)
                parent, tokens, bs = event["parent_block_hash"], event["token_ids"], event["block_size"]
                for i, h in enumerate(event["block_hashes"]):
                    self.blocks[h] = (parent, tokens[i * bs:(i + 1) * bs])
                    parent = h
            elif kind == "BlockRemoved":
                for h in event["block_hashes"]:
                    self.blocks.pop(h, None)
            elif kind == "AllBlocksCleared":
                self.blocks.clear()
            else:
                raise ValueError(f"kv events: unknown event type {kind!r}")

    def cached_prefix_blocks(self, token_ids: list[int], block_size: int) -> int:
        """How many leading full blocks of `token_ids` the mirror holds, by walking parents from the first block
        (as a router matches a request's prefix against a replica)."""
        n, parent = 0, None
        by_parent = {}
        for h, (p, toks) in self.blocks.items():
            by_parent.setdefault((p, tuple(toks)), h)
        for i in range(len(token_ids) // block_size):
            h = by_parent.get((parent, tuple(token_ids[i * block_size:(i + 1) * block_size])))
            if h is None:
                break
            n, parent = n + 1, h
        return n

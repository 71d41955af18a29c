"""The KV-event stream as a router reads it: a mirror fed vLLM's own batches (several blocks in one BlockStored)
matches the prefixes they store, and every event the engine records is a change to the set of hashes its
prefix cache can find (a hash is stored only while absent, removed only while present)."""
from __future__ import annotations

from engine import LLM, SamplingParams
from labkit.serve.kv_events import KVMirror


def test_a_mirror_reads_a_vllm_batch_that_stores_several_blocks_in_one_event():
    bs = 4
    prompt = list(range(100, 100 + 3 * bs + 1))
    mirror = KVMirror()
    mirror.apply([0.0, [{"type": "AllBlocksCleared"},
                        {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
                         "token_ids": prompt[:2 * bs], "block_size": bs, "lora_id": None, "medium": "GPU"},
                        {"type": "BlockStored", "block_hashes": [13], "parent_block_hash": 12,
                         "token_ids": prompt[2 * bs:3 * bs], "block_size": bs, "lora_id": None, "medium": "GPU"}]])
    assert mirror.cached_prefix_blocks(prompt, bs) == 3
    assert mirror.cached_prefix_blocks(prompt[bs:], bs) == 0          # the second block is not a root
    assert mirror.cached_prefix_blocks(prompt[:bs] + [1] * bs, bs) == 1
    mirror.apply([1.0, [{"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"}]])
    assert mirror.cached_prefix_blocks(prompt, bs) == 1


def test_every_recorded_event_changes_the_set_of_findable_hashes(tiny_model):
    """A prompt that is exactly the first block of an earlier one misses the prefix cache (the lookup skips the
    last block), computes that block again and registers its hash over the freed block's: the hash was
    findable already, so nothing is stored."""
    bs = 16
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=256, kvcache_block_size=bs,
              num_kvcache_blocks=32)
    try:
        llm.enable_kv_events()
        first = list(range(100, 100 + 3 * bs + 3))
        held: set[int] = set()
        params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        for prompt in (first, first[:bs], first[:2 * bs], first):
            llm.generate([prompt], params, use_tqdm=False)
            for event in llm.take_kv_events():
                if event[0] == "stored":
                    assert event[1] not in held, f"stored twice without a removal: {event[:3]}"
                    held.add(event[1])
                else:
                    assert event[1] in held, f"removed while not stored: {event}"
                    held.discard(event[1])
        assert held == set(llm.scheduler.block_manager.hash_to_block_id)
    finally:
        llm.exit()

"""What a request asks of the sampler. Free of torch, so case files and the CLI can check it cheaply."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    max_tokens: int = 64
    ignore_eos: bool = False
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0  # 1.0: off
    # This request's own random stream (vLLM's per-request seed); None: the engine's. [0, 2**63): the sampler's
    # row seeds are 63-bit (sampler.row_seeds), so each seed in it has a stream of its own and one beyond would
    # share another's; int64's non-negative range, as vLLM's API bounds it above.
    seed: int | None = None

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature: must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {self.max_tokens!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k: must be an integer >= 1, or -1/0 for off, got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 1 << 63):
            raise ValueError(f"seed: must be an integer in [0, 2**63) or None, got {self.seed!r}")

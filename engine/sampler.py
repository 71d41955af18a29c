"""The on-device sampler: temperature, top-k, top-p, then one draw per row."""
from __future__ import annotations

import torch


class Sampler:
    """Greedy, or Gumbel-max over temperature-scaled (and optionally top-k/top-p filtered) logits.

    Everything stays on the device: no host sync until the caller fetches the ids.
    """

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu"):
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor | None = None,
                 top_ps: torch.Tensor | None = None, greedy_rows: str = "some") -> torch.Tensor:
        """greedy_rows: "all", "none" or "some" (known on the host, so no device sync is needed to branch)."""
        logits = logits.float()
        if greedy_rows == "all":
            return logits.argmax(dim=-1)
        is_greedy = temperatures <= 0
        scaled = logits / torch.where(is_greedy, 1.0, temperatures).unsqueeze(1)
        if top_ks is not None:
            scaled = _apply_top_k(scaled, top_ks)
        if top_ps is not None:
            scaled = _apply_top_p(scaled, top_ps)
        probs = torch.softmax(scaled, dim=-1)
        # Gumbel-max: argmax(p / E) with E ~ Exp(1) samples from p.
        noise = torch.empty_like(probs).exponential_(1, generator=self.generator)
        sampled = probs.div_(noise.clamp_min_(1e-10)).argmax(dim=-1)
        if greedy_rows == "none":
            return sampled
        return torch.where(is_greedy, logits.argmax(dim=-1), sampled)


def _apply_top_k(logits: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[-1]
    k = torch.where(top_ks <= 0, vocab, top_ks.clamp(max=vocab))
    sorted_logits = logits.sort(dim=-1, descending=True).values
    kth = sorted_logits.gather(1, (k - 1).long().unsqueeze(1))
    return logits.masked_fill(logits < kth, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does.
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= top_ps.unsqueeze(1)
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))

"""How a step's tokens are picked: temperature, top-k, top-p, then one draw per row, on the device.

Each row's noise comes from its own seed (`row_seeds`): from the request's `seed` when it has one (vLLM's
per-request seed: the same seed and prompt give the same text, whatever else runs), else from the engine's
seed and the sequence. The seed also folds in the position being sampled. So a row's draw never depends on
the other rows of its batch, nor on how many steps ran before, and an engine that schedules differently
(async scheduling, another policy) samples the same tokens for the same sequence."""
from __future__ import annotations

import torch

from .profiling import phase


class Sampler:
    """Greedy, or Gumbel-max over temperature-scaled (and optionally top-k/top-p filtered) logits.

    Everything stays on the device: no host sync until the caller fetches the ids.
    """

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu"):
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor | None = None,
                 top_ps: torch.Tensor | None = None, greedy_rows: str = "some",
                 seeds: torch.Tensor | None = None) -> torch.Tensor:
        """greedy_rows: "all", "none" or "some" (known on the host, so no device sync is needed to branch).
        seeds: each row's noise seed (int64); None draws from this sampler's generator instead."""
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
        if seeds is None:
            noise = torch.empty_like(probs).exponential_(1, generator=self.generator)
        else:
            noise = -torch.log(keyed_uniform(seeds, probs.shape[1]))
        sampled = probs.div_(noise.clamp_min_(1e-10)).argmax(dim=-1)
        if greedy_rows == "none":
            return sampled
        return torch.where(is_greedy, logits.argmax(dim=-1), sampled)


_GOLDEN = -7046029254386353131      # 0x9E3779B97F4A7C15 as a signed int64
_MIX1 = -4658895280553007687        # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685        # 0x94D049BB133111EB


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """A logical right shift of int64 (torch's >> keeps the sign)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def keyed_uniform(seeds: torch.Tensor, n: int) -> torch.Tensor:
    """Uniform floats in (0, 1), [rows, n]: splitmix64 of (row seed, index), so element (r, i) depends on
    seeds[r] and i alone. (int64 products wrap, which the hash wants.)"""
    x = seeds.long().unsqueeze(1) + (torch.arange(1, n + 1, device=seeds.device) * _GOLDEN)
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return (_shr(x, 40).float() + 0.5) * (1.0 / (1 << 24))


# Row seeds: a request's own seed, or the engine's seed and the sequence id; and the position sampled.
_SEQ_SALT, _POS_SALT, _REQUEST_SALT = 0x5851F42D4C957F2D, 0x14057B7EF767814F, 0x2545F4914F6CDD1D
_M63 = (1 << 63) - 1


def row_seeds(engine_seed: int, seq_ids: list[int], positions: list[int], params: list) -> list[int]:
    """Each sampling row's noise seed (see the module docstring)."""
    base = engine_seed * _REQUEST_SALT
    return [((p.seed * _REQUEST_SALT if p.seed is not None else base + s * _SEQ_SALT) + t * _POS_SALT) & _M63
            for s, t, p in zip(seq_ids, positions, params)]


# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): logits / T in float32 overflows to inf near
# T = 1e-38 (every row then "draws" id 0), and the Gumbel kernel's 1 / T does at denormal T. Above the maximum,
# logits / T is indistinguishable from 0 for any logit the model makes: uniform, without the float32 overflow
# (and numpy's warning) that 1e308 would give.
MIN_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 1e6


def effective_temperature(t: float) -> float:
    return 0.0 if t < MIN_TEMPERATURE else min(t, MAX_TEMPERATURE)


def _apply_top_k(logits: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[-1]
    k = torch.where(top_ks <= 0, vocab, top_ks.clamp(max=vocab))
    sorted_logits = logits.sort(dim=-1, descending=True).values
    kth = sorted_logits.gather(1, (k - 1).long().unsqueeze(1))
    return logits.masked_fill(logits < kth, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does. The
    # top token always stays (a top_p too small for float32, 1e-300, reads as 0 and would drop every token).
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= top_ps.unsqueeze(1)
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class DeviceSampling:
    """The engine's sampling strategy: each sampling row's temperature, top-k and top-p, drawn on the device
    (the one-pass Triton Gumbel-max kernel where the kernels allow it and no row filters, else the torch
    Sampler), each row from its own seed. Returns the ids as a device tensor; the host reads them through
    Staging.fetch."""

    on_device = True

    def __init__(self, seed: int, device: torch.device, staging, gumbel_kernel: bool):
        self.seed = seed
        self.torch_sampler = Sampler(seed, device)
        self.staging = staging
        self.gumbel_kernel = gumbel_kernel

    def rows(self, plan) -> tuple[list[float], list[int], list[int]]:
        """Each sampling row's temperature and noise seed, and the rows that filter by top-k / top-p."""
        params = plan.sampling
        rows = plan.sample_rows
        temps = [effective_temperature(p.temperature) for p in params]
        seeds = row_seeds(self.seed, [plan.seq_ids[i] for i in rows], [plan.num_tokens[i] for i in rows], params)
        return temps, seeds, [i for i, p in enumerate(params) if p.top_k > 0 or p.top_p < 1.0]

    def in_graph(self, plan) -> tuple[list[float], list[int]] | None:
        """(temperatures, seeds) when a decode graph that ends in the Gumbel kernel may draw this plan's tokens
        (the kernel is on and no row filters); else None: __call__ draws them after the replay."""
        if not self.gumbel_kernel:
            return None
        temps, seeds, filtering = self.rows(plan)
        return None if filtering else (temps, seeds)

    @phase("engine::sample")
    def __call__(self, plan, logits: torch.Tensor) -> torch.Tensor:
        temps, seeds, filtering = self.rows(plan)
        # The Gumbel kernel cannot filter, and its noise is not the torch sampler's: under it, only the rows that
        # filter go through the torch sampler, so a row's draw never depends on whether another row of its batch
        # filters (before, one top-k row sent the whole batch to the torch sampler, redrawing every other row).
        by_torch = [plan.sampling[i] for i in filtering] if self.gumbel_kernel else plan.sampling
        top_ks = [p.top_k for p in by_torch] if any(p.top_k > 0 for p in by_torch) else None
        top_ps = [p.top_p for p in by_torch] if any(p.top_p < 1.0 for p in by_torch) else None
        # Copied while the forward pass may still run: the step's only wait is fetching the sampled ids.
        dev = self.staging.upload(temperatures=(temps, torch.float32), seeds=(seeds, torch.int64),
                                  rows=((filtering if self.gumbel_kernel else None) or None, torch.int64),
                                  top_ks=(top_ks, torch.int64), top_ps=(top_ps, torch.float32))
        if not self.gumbel_kernel:
            return self._torch_draw(logits, dev["temperatures"], dev["seeds"], temps, dev)
        from .kernels.gumbel_sampler import gumbel_argmax

        ids = gumbel_argmax(logits, dev["temperatures"], dev["seeds"])
        if filtering:
            r = dev["rows"]
            ids[r] = self._torch_draw(logits[r], dev["temperatures"][r], dev["seeds"][r],
                                      [temps[i] for i in filtering], dev)
        return ids

    def _torch_draw(self, logits, temperatures, seeds, temps: list[float], dev) -> torch.Tensor:
        greedy = sum(t <= 0 for t in temps)
        greedy_rows = "all" if greedy == len(temps) else ("none" if greedy == 0 else "some")
        return self.torch_sampler(logits, temperatures, dev.get("top_ks"), dev.get("top_ps"), greedy_rows, seeds)


class TeacherForcing:
    """A host-side strategy: `choose(plan, logits) -> list[int]` picks each sampling row's token from its
    logits row (logits-check forces a fixed token path and keeps the rows). The host must see the logits
    before the next step can be scheduled, so an engine using it runs without async scheduling."""

    on_device = False

    def __init__(self, choose):
        self.choose = choose

    def __call__(self, plan, logits: torch.Tensor) -> list[int]:
        return [int(t) for t in self.choose(plan, logits)]

"""TPU chip figures, and analytic step-time estimates of the paper's training step on them.

Counted by hand because XLA's cost analysis counts a scanned layer once. FLOPs of a forward pass
over `tokens` tokens of sequences `length` long: `2 x matmul parameters x tokens` plus causal
attention, `2 x 2 x layers x heads x head_dim x tokens x length / 2` (scores and values, half the
keys on average). An update micro-step with remat costs 4 forward passes (forward, recompute,
backward twice); the old / reference log-prob passes one each. Decoding is bound by memory
bandwidth: with a sampling layout (`seal_jax.weight_sync`) each chip of a group reads its share
of the compute-dtype weights and of its group's KV cache per decode step, groups and hosts
decoding their rows side by side; the copy itself moves each chip's share over the chips'
interconnect once per step. Without one (the trainer's layout, one host) the estimate reads the
weights once over all chips, a bound the per-token weight gathers of that layout do not reach.
Times assume MFU_ASSUMED of the chips' peak bf16 FLOP/s, full HBM and interconnect bandwidth,
and every row filling the context, half of it generated: upper bounds for a step's work.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seal_jax import episodes
from seal_jax.models import QwenConfig

MFU_ASSUMED = 0.4
PAPER_STEPS = 72


@dataclasses.dataclass(frozen=True)
class Chip:
    """Figures of one TPU kind: the memory a program may use (what libtpu 0.0.42's compiler
    reports as available, a little under the HBM; v6e: its 32 GB, unverified), and the vendor's
    peak bf16 FLOP/s, HBM bytes/s and interchip-interconnect bytes/s (all links)."""

    available_hbm_gib: float
    peak_flops: float
    hbm_bandwidth: float
    ici_bandwidth: float


CHIPS = {  # by jax device_kind
    "TPU v4": Chip(30.75, 275e12, 1.2e12, 2400e9 / 8),
    "TPU v5 lite": Chip(15.75, 197e12, 0.82e12, 1600e9 / 8),
    "TPU v5": Chip(95.74, 459e12, 2.76e12, 4800e9 / 8),
    "TPU v6 lite": Chip(32.0, 918e12, 1.64e12, 3584e9 / 8),
}


def matmul_parameters(cfg: QwenConfig) -> int:
    """Weights multiplied per token: q/k/v/o, the MLP, and the output matrix."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    attention = cfg.hidden_size * (2 * q + 2 * kv)
    mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    return cfg.num_layers * (attention + mlp) + cfg.hidden_size * cfg.vocab_size


def forward_flops(cfg: QwenConfig, rows: int, length: int) -> float:
    """FLOPs of one forward pass over `rows` sequences of `length` tokens."""
    tokens = rows * length
    attention = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * length
    return 2.0 * matmul_parameters(cfg) * tokens + attention


def step_estimate(
    config: Any,
    cfg: QwenConfig,
    device_kind: str,
    chips: int,
    hosts: int = 1,
    gathered_bytes_per_token: float = 0.0,
) -> dict:
    """Seconds of the update and of the rollout of one training step at the config's sizes on
    `chips` chips of `hosts` hosts, of the paper's 72 steps, and the decode figures per chip;
    {} for a device kind without figures (e.g. CPU). gathered_bytes_per_token: the weights the
    compiled decode loop all-gathers per token per chip (`seal_jax.aot`), which bound a decode
    step from below at the interconnect's bandwidth."""
    if device_kind not in CHIPS:
        return {}
    chip = CHIPS[device_kind]
    length = config.rollout.context_limit
    rows = config.train.batch_tasks * config.rl.group_size
    passes = 4 + (config.rl.old_logprobs == "recompute") + (config.rl.kl_coef > 0)
    update_flops = passes * forward_flops(cfg, rows, length)
    update_s = update_flops / (chips * chip.peak_flops * MFU_ASSUMED)
    decode = decode_estimate(config, cfg, chip, chips, hosts, gathered_bytes_per_token)
    generated = length // 2
    rollout_s = decode["chunks_per_host"] * generated * decode["step_s"] + decode["copy_s"]
    return {
        "assumptions": f"{MFU_ASSUMED:.0%} MFU, full HBM and interconnect bandwidth, every row "
        f"{length} tokens ({generated} generated)",
        "update_flops_per_step": update_flops,
        "update_s_per_step": update_s,
        "rollout_s_per_step": rollout_s,
        "decode": decode,
        "paper_run_hours": PAPER_STEPS * (update_s + rollout_s) / 3600,
    }


def decode_estimate(
    config: Any, cfg: QwenConfig, chip: Chip, chips: int, hosts: int, gathered: float = 0.0
) -> dict:
    """Per decode step of a rollout chunk, at half the context on average: bytes each chip
    reads, seconds (full HBM bandwidth, or the interconnect's for `gathered` bytes of weights
    all-gathered per chip, whichever is slower), tokens per second per chip; the sampling
    copy's seconds; and the chunks each host runs one after another."""
    group = config.rollout.sampler_tensor or (chips // hosts if hosts > 1 else 0)
    kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2  # k, v bf16
    weights = 2 * matmul_parameters(cfg)  # bf16
    chunk = episodes.chunk_rows(config)  # rows of one host's rollout chunk
    rows_per_host = config.train.batch_tasks * config.rl.group_size // hosts
    if group:  # each group of `group` chips decodes its share of the chunk's rows
        readers, rows_per_group = group, chunk * group * hosts // chips
        copy_s = (weights / group + 2 * weights / chips) / chip.ici_bandwidth
    else:  # the trainer's layout on one host: all chips decode every row
        readers, rows_per_group, copy_s = chips, chunk, 0.0
    step_bytes = (
        weights + rows_per_group * kv_bytes_per_token * config.rollout.context_limit / 2
    ) / readers
    step_s = max(step_bytes / chip.hbm_bandwidth, gathered / chip.ici_bandwidth)
    return {
        "sampler_group_chips": group,
        "bytes_per_chip_per_step": step_bytes,
        "step_s": step_s,
        "tokens_per_s_per_chip": rows_per_group / step_s / readers,
        "copy_s": copy_s,
        "chunks_per_host": -(-rows_per_host // chunk),
    }

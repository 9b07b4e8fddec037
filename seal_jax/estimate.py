"""TPU chip figures, and analytic step-time estimates of the paper's training step on them.

Counted by hand because XLA's cost analysis counts a scanned layer once. FLOPs of a forward pass
over `tokens` tokens of sequences `length` long: `2 x matmul parameters x tokens` plus causal
attention in the layers with a KV cache (all of Qwen's, Qwen3.5's full-attention layers), `2 x 2 x
layers x heads x head_dim x tokens x length / 2` (scores and values, half the keys on average),
plus Qwen3.5's linear-attention layers' chunked delta rule, which does not grow with the length
(`linear_attention_flops`). An update micro-step with remat costs 4 forward passes (forward,
recompute, backward twice); the old / reference log-prob passes one each. Decoding is bound by
memory bandwidth: with a sampling layout (`seal_jax.weight_sync`) each chip of a group reads its
share of the compute-dtype weights and of its group's KV cache (split over the group when its KV
heads are) per decode step, groups and hosts decoding their rows side by side; Qwen3.5's
linear-attention weights and recurrent states are whole on every chip of a group
(`seal_jax.sharding` splits them over FSDP only), so each chip reads those whole and reads and
writes its group's states once per step. The copy itself moves each chip's share over the chips'
interconnect once per step. Without a layout (the trainer's layout, one host) the estimate reads
the weights once over all chips, a bound the per-token weight gathers of that layout do not reach.
Times assume MFU_ASSUMED of the chips' peak bf16 FLOP/s, full HBM and interconnect bandwidth, and
every row filling the context, half of it generated: upper bounds for a step's work.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seal_jax import episodes
from seal_jax.models import Qwen35Config, QwenConfig

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


def matmul_parameters(cfg: QwenConfig | Qwen35Config) -> int:
    """Weights multiplied per token: every layer's attention (or linear attention) and MLP, and
    the output matrix. Qwen3.5's full-attention layers: q_proj twice as wide (each head's query
    and output gate), k_proj, v_proj, o_proj; its linear-attention layers: `linear_parameters`."""
    e = cfg.hidden_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    mlp = 3 * e * cfg.intermediate_size
    head = e * cfg.vocab_size
    if not isinstance(cfg, Qwen35Config):
        return cfg.num_layers * (e * (2 * q + 2 * kv) + mlp) + head
    full = e * (3 * q + 2 * kv)  # q_proj (query and gate) and o_proj, k_proj and v_proj
    return cfg.num_full_layers * full + linear_parameters(cfg) + cfg.num_layers * mlp + head


def linear_parameters(cfg: QwenConfig | Qwen35Config) -> int:
    """Weights multiplied per token in Qwen3.5's linear-attention layers' mixers: in_proj_qkv,
    in_proj_z, in_proj_b, in_proj_a, out_proj, and the depthwise conv1d (each of its weights
    multiplies one input per token); 0 for Qwen. The sampling layout keeps these whole on every
    chip of a group."""
    if not isinstance(cfg, Qwen35Config):
        return 0
    e, heads = cfg.hidden_size, cfg.linear_num_value_heads
    value = heads * cfg.linear_value_head_dim
    projections = e * (cfg.conv_dim + value + 2 * heads) + value * e
    return cfg.num_linear_layers * (projections + cfg.conv_dim * cfg.conv_kernel)


def attention_layers(cfg: QwenConfig | Qwen35Config) -> int:
    """The layers with a KV cache: all of Qwen's, Qwen3.5's full-attention layers."""
    return cfg.num_full_layers if isinstance(cfg, Qwen35Config) else cfg.num_layers


def linear_attention_flops(cfg: QwenConfig | Qwen35Config, tokens: int) -> float:
    """FLOPs of Qwen3.5's chunked delta rule (`qwen35.chunked_delta_rule`, chunks of C =
    `linear_chunk` positions) over `tokens` tokens in every linear-attention layer, beyond its
    projections; 0 for Qwen. Per token and value head: C x (5 dk + 3 dv) for the chunk's C x C
    products (k_beta k^T, q k^T, and the latter with the updates) and its two triangular solves
    (widths dv and dk), and 6 dk dv for reading the incoming state twice and updating it."""
    if not isinstance(cfg, Qwen35Config):
        return 0.0
    dk, dv, c = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_chunk
    per_head = c * (5 * dk + 3 * dv) + 6 * dk * dv
    return float(cfg.num_linear_layers * cfg.linear_num_value_heads * per_head * tokens)


def forward_flops(cfg: QwenConfig | Qwen35Config, rows: int, length: int) -> float:
    """FLOPs of one forward pass over `rows` sequences of `length` tokens."""
    tokens = rows * length
    attention = 2 * attention_layers(cfg) * cfg.num_heads * cfg.head_dim * tokens * length
    return 2.0 * matmul_parameters(cfg) * tokens + attention + linear_attention_flops(cfg, tokens)


def cache_bytes_per_row(
    cfg: QwenConfig | Qwen35Config, slots: int, dtype_bytes: int = 2
) -> dict[str, int]:
    """Bytes of one row of the rollout engine's cache (`seal_jax.rollout.new_cache`) with
    `slots` slots of history, keys and values in a `dtype_bytes`-byte dtype, by part: "kv" (keys
    and values of the attention layers), "mask" (a byte per slot), "index" (the write
    position), and Qwen3.5's linear-attention layers' "conv" (the convolution's last K - 1
    inputs, cache dtype) and "state" (float32 recurrent state), neither of which grows with
    slots (0 for Qwen)."""
    kv = 2 * attention_layers(cfg) * cfg.num_kv_heads * cfg.head_dim * slots * dtype_bytes
    parts = {"kv": kv, "mask": slots, "index": 4, "conv": 0, "state": 0}
    if isinstance(cfg, Qwen35Config):
        n = cfg.num_linear_layers
        parts["conv"] = n * (cfg.conv_kernel - 1) * cfg.conv_dim * dtype_bytes
        state = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
        parts["state"] = n * state * 4
    return parts


def step_estimate(
    config: Any,
    cfg: QwenConfig | Qwen35Config,
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
    config: Any,
    cfg: QwenConfig | Qwen35Config,
    chip: Chip,
    chips: int,
    hosts: int,
    gathered: float = 0.0,
) -> dict:
    """Per decode step of a rollout chunk, at half the context on average: bytes each chip
    reads (and, for Qwen3.5's recurrent states, writes back), seconds (full HBM bandwidth, or
    the interconnect's for `gathered` bytes of weights all-gathered per chip, whichever is
    slower), tokens per second per chip; the sampling copy's seconds; and the chunks each host
    runs one after another."""
    group = config.rollout.sampler_tensor or (chips // hosts if hosts > 1 else 0)
    row = cache_bytes_per_row(cfg, config.rollout.context_limit // 2)
    states = 2 * (row["conv"] + row["state"])  # read and written every step
    weights = 2 * matmul_parameters(cfg)  # bf16
    chunk = episodes.chunk_rows(config)  # rows of one host's rollout chunk
    rows_per_host = config.train.batch_tasks * config.rl.group_size // hosts
    if group:  # each group of `group` chips decodes its share of the chunk's rows
        readers, rows_per_group = group, chunk * group * hosts // chips
        whole = 2 * linear_parameters(cfg)  # bf16, whole on every chip of the group
        share = (weights - whole) / group + whole  # a chip's shard of the sampling copy
        kv_split = group if cfg.num_kv_heads % group == 0 else 1
        step_bytes = share + rows_per_group * (row["kv"] / kv_split + states)
        copy_s = (share + 2 * weights / chips) / chip.ici_bandwidth
    else:  # the trainer's layout on one host: all chips decode every row
        readers, rows_per_group, copy_s = chips, chunk, 0.0
        step_bytes = (weights + rows_per_group * (row["kv"] + states)) / readers
    step_s = max(step_bytes / chip.hbm_bandwidth, gathered / chip.ici_bandwidth)
    return {
        "sampler_group_chips": group,
        "bytes_per_chip_per_step": step_bytes,
        "step_s": step_s,
        "tokens_per_s_per_chip": rows_per_group / step_s / readers,
        "copy_s": copy_s,
        "chunks_per_host": -(-rows_per_host // chunk),
    }

"""The Qwen architecture description, read from a Hugging Face `config.json`.

Only what the Flax model implements is accepted; any field that would change the computation in a
way we do not implement (rope scaling, sliding windows, MoE, other activations) is refused with a
clear error instead of being silently ignored.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3")


class CheckpointError(ValueError):
    """A checkpoint directory, file or config that cannot be used, with a message naming it."""


@dataclasses.dataclass(frozen=True)
class QwenConfig:
    """Architecture hyper-parameters of a Qwen2 / Qwen2.5 / Qwen3 causal LM."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    qkv_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    hf_config: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> QwenConfig:
        """Builds the config from a parsed HF config dict; raises CheckpointError if unsupported."""
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"{source}: model_type {model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        _refuse_unsupported(d, source)
        try:
            hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
            cfg = cls(
                model_type=model_type,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rope_theta=float(_rope_theta(d)),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                # Qwen2 always has q/k/v biases; Qwen3 has none unless attention_bias is set.
                qkv_bias=True if model_type == "qwen2" else bool(d.get("attention_bias", False)),
                qk_norm=model_type == "qwen3",
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
                hf_config=dict(d),
            )
        except KeyError as e:
            raise CheckpointError(f"{source}: required field {e.args[0]!r} is missing") from None
        if cfg.num_heads % cfg.num_kv_heads:
            raise CheckpointError(
                f"{source}: num_attention_heads={cfg.num_heads} is not a multiple of "
                f"num_key_value_heads={cfg.num_kv_heads}"
            )
        return cfg

    @classmethod
    def from_dir(cls, path: str) -> QwenConfig:
        """Reads `<path>/config.json`; raises CheckpointError naming the problem."""
        if not os.path.isdir(path):
            raise CheckpointError(f"checkpoint directory {path!r} does not exist")
        file = os.path.join(path, "config.json")
        if not os.path.isfile(file):
            raise CheckpointError(f"{file}: missing (not a Hugging Face model directory)")
        try:
            with open(file) as f:
                d = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{file}: not valid JSON ({e})") from None
        return cls.from_hf_dict(d, source=file)


def _rope_theta(d: dict[str, Any]) -> float:
    """The rope base from either the transformers v5 `rope_parameters` or the v4 `rope_theta`."""
    params = d.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return params["rope_theta"]
    return d.get("rope_theta", 10000.0)


def _refuse_unsupported(d: dict[str, Any], source: str) -> None:
    """Raises CheckpointError for config fields that change the computation and are not built."""
    if d.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: hidden_act {d['hidden_act']!r} is not supported")
    for key in ("rope_scaling", "rope_parameters"):
        rope = d.get(key)
        if isinstance(rope, dict):
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type != "default":
                raise CheckpointError(
                    f"{source}: {key} type {rope_type!r} is not supported (only default RoPE)"
                )
    if d.get("use_sliding_window"):
        raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
    layer_types = d.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise CheckpointError(f"{source}: only full_attention layers are supported")
    for key in ("num_experts", "num_local_experts", "moe_intermediate_size"):
        if d.get(key):
            raise CheckpointError(f"{source}: mixture-of-experts ({key}) is not supported")

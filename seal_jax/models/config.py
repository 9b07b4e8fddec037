"""The architecture description of the model family (Qwen2, Qwen3, Llama), read from a Hugging
Face `config.json`.

Only what the Flax model implements is accepted; any field that would change the computation in a
way we do not implement (rope scaling other than Llama 3.1's, sliding windows, MoE, other
activations, Llama's output/MLP biases) is refused with a clear error instead of being silently
ignored.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


class CheckpointError(ValueError):
    """A checkpoint directory, file or config that cannot be used, with a message naming it."""


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's rescaling of the RoPE frequencies (`rope_type: llama3`): frequencies whose
    wavelength exceeds original_max_position_embeddings / low_freq_factor are divided by
    `factor`, those shorter than original_max_position_embeddings / high_freq_factor are kept,
    and those in between are interpolated."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class QwenConfig:
    """Architecture hyper-parameters of a Qwen2 / Qwen2.5 / Qwen3 / Llama 3 causal LM.

    rope_scaling: Llama 3.1's frequency rescaling, or None for the default RoPE.
    """

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
    rope_scaling: Llama3RopeScaling | None = None
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
                # Qwen2 always has q/k/v biases; Qwen3 has none unless attention_bias is set;
                # Llama has none (its attention_bias, which adds an o_proj bias, is refused).
                qkv_bias=True if model_type == "qwen2" else bool(d.get("attention_bias", False)),
                qk_norm=model_type == "qwen3",
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
                rope_scaling=_rope_scaling(d, source),
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


def _rope_dicts(d: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(key, dict, rope type) of the v4 `rope_scaling` and v5 `rope_parameters` fields present."""
    found = []
    for key in ("rope_scaling", "rope_parameters"):
        rope = d.get(key)
        if isinstance(rope, dict):
            found.append((key, rope, rope.get("rope_type", rope.get("type", "default"))))
    return found


def _rope_scaling(d: dict[str, Any], source: str) -> Llama3RopeScaling | None:
    """The llama3 frequency rescaling of the config, or None for the default RoPE."""
    for key, rope, rope_type in _rope_dicts(d):
        if rope_type != "llama3":
            continue
        # As transformers: a top-level original_max_position_embeddings wins over the rope
        # dict's, which falls back to max_position_embeddings.
        original = d.get(
            "original_max_position_embeddings",
            rope.get("original_max_position_embeddings", d.get("max_position_embeddings")),
        )
        try:
            scaling = Llama3RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(original),
            )
        except KeyError as e:
            raise CheckpointError(f"{source}: {key} of type llama3 lacks {e.args[0]!r}") from None
        except (TypeError, ValueError):
            raise CheckpointError(
                f"{source}: {key} of type llama3 has a non-numeric field"
            ) from None
        if scaling.high_freq_factor <= scaling.low_freq_factor:
            raise CheckpointError(f"{source}: {key} needs high_freq_factor > low_freq_factor")
        return scaling
    return None


def _refuse_unsupported(d: dict[str, Any], source: str) -> None:
    """Raises CheckpointError for config fields that change the computation and are not built."""
    if d.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: hidden_act {d['hidden_act']!r} is not supported")
    for key, _, rope_type in _rope_dicts(d):
        if rope_type not in ("default", "llama3"):
            raise CheckpointError(
                f"{source}: {key} type {rope_type!r} is not supported (only default and llama3 "
                "RoPE)"
            )
    # Llama's attention_bias also adds an o_proj bias and mlp_bias biases to the MLP: not built.
    if d.get("model_type") == "llama" and d.get("attention_bias"):
        raise CheckpointError(f"{source}: attention_bias=true is not supported for llama")
    if d.get("mlp_bias"):
        raise CheckpointError(f"{source}: mlp_bias=true is not supported")
    if d.get("use_sliding_window"):
        raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
    layer_types = d.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise CheckpointError(f"{source}: only full_attention layers are supported")
    for key in ("num_experts", "num_local_experts", "moe_intermediate_size"):
        if d.get(key):
            raise CheckpointError(f"{source}: mixture-of-experts ({key}) is not supported")


# Qwen3.5: `qwen3_5` is the vision-language checkpoint (its text model under `text_config`),
# `qwen3_5_text` the text-only causal LM that transformers' Qwen3_5ForCausalLM writes.
QWEN35_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"


@dataclasses.dataclass(frozen=True)
class Qwen35Config:
    """Architecture hyper-parameters of Qwen3.5's text model: Gated DeltaNet linear-attention
    layers and gated full-attention layers (output gate, partial rotary), in `layer_types` order.

    rotary_dim: leading dims of each head that RoPE rotates (head_dim * partial_rotary_factor).
    linear_chunk: positions per chunk of the chunked (training) form of the linear attention; a
      setting of ours, not of the checkpoint (the result does not depend on it).
    weight_prefix: where the text model's tensors live in the checkpoint ("model." for the causal
      LM, "model.language_model." for the vision-language one).
    """

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
    tie_word_embeddings: bool
    max_position_embeddings: int
    rotary_dim: int
    layer_types: tuple[str, ...]
    conv_kernel: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_chunk: int = 64
    weight_prefix: str = "model."
    hf_config: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # What the shared Qwen code paths (MLP, estimates) read; fixed for this family.
    qkv_bias = False
    qk_norm = True
    rope_scaling = None

    @property
    def layer_pattern(self) -> tuple[str, ...]:
        """The shortest run of layer types whose repetition is `layer_types` (the model scans
        over its repetitions; Qwen3.5's default is three linear layers then one full)."""
        n = self.num_layers
        for p in range(1, n + 1):
            if n % p == 0 and self.layer_types == self.layer_types[:p] * (n // p):
                return self.layer_types[:p]
        raise AssertionError("unreachable: p = num_layers always repeats")

    @property
    def num_linear_layers(self) -> int:
        """How many layers are linear attention."""
        return self.layer_types.count(LINEAR_ATTENTION)

    @property
    def num_full_layers(self) -> int:
        """How many layers are full attention (the layers with a KV cache)."""
        return self.layer_types.count(FULL_ATTENTION)

    @property
    def conv_dim(self) -> int:
        """Channels of the linear layers' convolution: queries, keys and values together."""
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        return 2 * key_dim + self.linear_num_value_heads * self.linear_value_head_dim

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> Qwen35Config:
        """Builds the config from a parsed HF config dict (`qwen3_5` with a `text_config`, or
        `qwen3_5_text`); raises CheckpointError if unsupported."""
        if d.get("model_type") not in QWEN35_MODEL_TYPES:
            raise CheckpointError(f"{source}: model_type {d.get('model_type')!r} is not Qwen3.5")
        vision = d["model_type"] == "qwen3_5"
        text = dict(d.get("text_config") or {}) if vision else dict(d)
        if vision and not text:
            raise CheckpointError(f"{source}: a qwen3_5 config needs a text_config")
        if vision:  # the language model's head is tied (or not) by the outer config
            text["tie_word_embeddings"] = d.get("tie_word_embeddings", False)
        _refuse_unsupported_qwen35(text, source)
        try:
            cfg = cls(**_qwen35_fields(text), hf_config=text)
        except KeyError as e:
            raise CheckpointError(f"{source}: required field {e.args[0]!r} is missing") from None
        cfg = dataclasses.replace(
            cfg, weight_prefix="model.language_model." if vision else "model."
        )
        _check_qwen35(cfg, source)
        return cfg


def _qwen35_fields(t: dict[str, Any]) -> dict[str, Any]:
    """The Qwen35Config fields from a text config dict (transformers' defaults where absent)."""
    layers, heads = int(t["num_hidden_layers"]), int(t["num_attention_heads"])
    head_dim = int(t.get("head_dim") or 256)
    rope = t.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25))
    interval = int(t.get("full_attention_interval", 4))
    default_types = [
        LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(layers)
    ]
    return dict(
        model_type="qwen3_5_text",
        vocab_size=int(t["vocab_size"]),
        hidden_size=int(t["hidden_size"]),
        intermediate_size=int(t["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(t.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rope_theta=float(_rope_theta(t)),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(t.get("tie_word_embeddings", False)),
        max_position_embeddings=int(t.get("max_position_embeddings", 32768)),
        rotary_dim=int(head_dim * float(partial)),
        layer_types=tuple(t.get("layer_types") or default_types),
        conv_kernel=int(t.get("linear_conv_kernel_dim", 4)),
        linear_num_key_heads=int(t.get("linear_num_key_heads", 16)),
        linear_num_value_heads=int(t.get("linear_num_value_heads", 32)),
        linear_key_head_dim=int(t.get("linear_key_head_dim", 128)),
        linear_value_head_dim=int(t.get("linear_value_head_dim", 128)),
    )


def _refuse_unsupported_qwen35(t: dict[str, Any], source: str) -> None:
    """Raises CheckpointError for text-config fields that change the computation and are not
    built. mrope_section / mrope_interleaved are accepted: text tokens have the same position
    on all three rotary streams, so multimodal RoPE reduces to the default one for them."""
    if t.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: hidden_act {t['hidden_act']!r} is not supported")
    if t.get("attention_bias"):
        raise CheckpointError(f"{source}: attention_bias=true is not supported for qwen3_5")
    if not t.get("attn_output_gate", True):
        raise CheckpointError(f"{source}: attn_output_gate=false is not supported for qwen3_5")
    for key, _, rope_type in _rope_dicts(t):
        if rope_type != "default":
            raise CheckpointError(f"{source}: {key} type {rope_type!r} is not supported")
    for key in ("num_experts", "num_local_experts", "moe_intermediate_size"):
        if t.get(key):
            raise CheckpointError(f"{source}: mixture-of-experts ({key}) is not supported")


def _check_qwen35(cfg: Qwen35Config, source: str) -> None:
    """Raises CheckpointError for inconsistent sizes or unknown layer types."""
    unknown = set(cfg.layer_types) - {LINEAR_ATTENTION, FULL_ATTENTION}
    if unknown:
        raise CheckpointError(f"{source}: layer_types {sorted(unknown)} are not supported")
    if len(cfg.layer_types) != cfg.num_layers:
        raise CheckpointError(
            f"{source}: layer_types has {len(cfg.layer_types)} entries for "
            f"num_hidden_layers={cfg.num_layers}"
        )
    if cfg.num_heads % cfg.num_kv_heads:
        raise CheckpointError(
            f"{source}: num_attention_heads={cfg.num_heads} is not a multiple of "
            f"num_key_value_heads={cfg.num_kv_heads}"
        )
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise CheckpointError(
            f"{source}: linear_num_value_heads={cfg.linear_num_value_heads} is not a multiple "
            f"of linear_num_key_heads={cfg.linear_num_key_heads}"
        )
    if cfg.rotary_dim % 2 or not 0 < cfg.rotary_dim <= cfg.head_dim:
        raise CheckpointError(
            f"{source}: partial rotary gives {cfg.rotary_dim} rotary dims of head_dim "
            f"{cfg.head_dim} (need an even number in 1..head_dim)"
        )


def read_config_json(path: str) -> tuple[dict[str, Any], str]:
    """The parsed `<path>/config.json` and its file name; raises CheckpointError naming the
    problem."""
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint directory {path!r} does not exist")
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise CheckpointError(f"{file}: missing (not a Hugging Face model directory)")
    try:
        with open(file) as f:
            return json.load(f), file
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None


def architecture_from_dir(path: str) -> QwenConfig | Qwen35Config:
    """The architecture of the checkpoint at `path`: Qwen35Config for Qwen3.5, else QwenConfig
    (Qwen2/Qwen3/Llama); raises CheckpointError if it is unsupported."""
    d, file = read_config_json(path)
    if d.get("model_type") in QWEN35_MODEL_TYPES:
        return Qwen35Config.from_hf_dict(d, source=file)
    return QwenConfig.from_hf_dict(d, source=file)

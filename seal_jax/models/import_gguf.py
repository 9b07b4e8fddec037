"""Imports a GGUF file (llama.cpp's format) as a Hugging Face model directory.

    python -m seal_jax.models.import_gguf --gguf=FILE --out=DIR [--dtype=float32|bfloat16]

writes DIR/model.safetensors (shards above 4 GiB), config.json, generation_config.json,
tokenizer.json, tokenizer_config.json and chat_template.jinja: what `run.py
--config.model.path=DIR`, transformers' `AutoModelForCausalLM` / `AutoTokenizer` and vLLM load.
Nothing is downloaded. The file is read with `gguf.GGUFReader` (the llama.cpp project's reader)
and every tensor is dequantized to float32 by `gguf_dequant` (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), then cast to --dtype: a quantized file gives the
quantized model's values exactly, not the original float weights.

Architectures: llama, qwen2 (q/k/v biases) and qwen3 (q/k norms), with default RoPE. llama.cpp's
converter stores llama's q and k projections with the rows of each head interleaved (the two
rotary halves alternating, its rope layout); the import puts them back in Hugging Face's order.

Tokenizer: the file's GPT-2-style byte-level BPE (vocabulary, merges, control tokens as
special tokens) with the pre-tokenizer its `tokenizer.ggml.pre` names (PRE_TOKENIZERS). Chat
template: the file's own; a ChatML template without a tools section (SmolLM2's) gets SmolLM2's
function-calling convention in front (templates/smollm2_tools.jinja), which renders `tools=`,
assistant `tool_calls` and tool messages and leaves every other render unchanged.

Bad input (a missing or corrupt file, an unsupported architecture, tensor or quantization type,
an --out that exists and is not empty) ends in one `error:` line and exit code 2.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from absl import app, flags, logging

from seal_jax.models.checkpoint import hf_config_dict, hf_tensor_shapes
from seal_jax.models.config import CheckpointError, QwenConfig
from seal_jax.models.gguf_dequant import SUPPORTED_TYPES, dequantize
from seal_jax.models.safetensors_io import write_sharded

ARCHITECTURES = ("llama", "qwen2", "qwen3")
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
TOOLS_TEMPLATE = Path(__file__).parent.parent / "templates" / "smollm2_tools.jinja"

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# The pre-tokenizers of `tokenizer.ggml.pre` (llama.cpp's names), as tokenizers' JSON: the
# regexes of llama.cpp's llama-vocab.cpp for each, in the layout of the models' own
# tokenizer.json files. smollm splits every digit off first, then applies GPT-2's regex.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = _QWEN2_SPLIT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")


def _split(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def _byte_level(trim_offsets: bool, use_regex: bool) -> dict:
    return {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": trim_offsets,
        "use_regex": use_regex,
    }


PRE_TOKENIZERS = {  # name: (normalizer, pre_tokenizer)
    "smollm": (
        None,
        {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                _byte_level(trim_offsets=True, use_regex=True),
            ],
        },
    ),
    "qwen2": (
        {"type": "NFC"},
        {"type": "Sequence", "pretokenizers": [_split(_QWEN2_SPLIT), _byte_level(False, False)]},
    ),
    "llama-bpe": (
        None,
        {"type": "Sequence", "pretokenizers": [_split(_LLAMA3_SPLIT), _byte_level(True, False)]},
    ),
}
_CONTROL, _USER_DEFINED = 3, 4  # gguf.TokenType values of special and added tokens
_REQUIRED = object()


class _Gguf:
    """The metadata and tensors of one GGUF file, with errors that name it."""

    def __init__(self, path: str):
        from gguf import GGUFReader

        self.path = path
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: no such file")
        try:
            reader = GGUFReader(path)
        except (ValueError, OSError, IndexError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: not a readable GGUF file ({e})") from None
        self.fields = reader.fields
        self.tensors = {t.name: t for t in reader.tensors}
        self.arch = self.value("general.architecture")

    def value(self, key: str, default: Any = _REQUIRED) -> Any:
        """The metadata value `key` (`{arch}.` prefixes it with the architecture)."""
        key = key.format(arch=getattr(self, "arch", ""))
        field = self.fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise CheckpointError(f"{self.path}: metadata {key} is missing")
            return default
        return field.contents()

    def shape(self, name: str) -> tuple[int, ...]:
        """NumPy shape of tensor `name` (GGUF lists the fastest dimension first)."""
        return tuple(int(n) for n in reversed(self.tensors[name].shape))


def read_config(g: _Gguf) -> QwenConfig:
    """The architecture of the file, from its metadata; raises CheckpointError if unsupported."""
    if g.arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{g.path}: architecture {g.arch!r} is not supported (supported: "
            f"{', '.join(ARCHITECTURES)})"
        )
    scaling = g.value("{arch}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in g.tensors:
        raise CheckpointError(f"{g.path}: rope scaling ({scaling}) is not supported")
    integers = {}
    for key, default in (
        ("{arch}.block_count", _REQUIRED),
        ("{arch}.embedding_length", _REQUIRED),
        ("{arch}.feed_forward_length", _REQUIRED),
        ("{arch}.attention.head_count", _REQUIRED),
        ("{arch}.attention.head_count_kv", None),
        ("{arch}.context_length", 32768),
    ):
        value = g.value(key, default)
        if value is not None and not isinstance(value, int):
            raise CheckpointError(f"{g.path}: per-layer {key.format(arch=g.arch)} is not supported")
        integers[key.split(".", 1)[1]] = value
    hidden, heads = integers["embedding_length"], integers["attention.head_count"]
    head_dim = g.value("{arch}.attention.key_length", hidden // heads)
    if g.value("{arch}.attention.value_length", head_dim) != head_dim:
        raise CheckpointError(f"{g.path}: key and value head sizes differ (not supported)")
    if g.value("{arch}.rope.dimension_count", head_dim) != head_dim:
        raise CheckpointError(f"{g.path}: partial rotary embeddings are not supported")
    if "token_embd.weight" not in g.tensors:
        raise CheckpointError(f"{g.path}: tensor token_embd.weight is missing")
    return QwenConfig(
        model_type=g.arch,
        vocab_size=g.shape("token_embd.weight")[0],
        hidden_size=hidden,
        intermediate_size=integers["feed_forward_length"],
        num_layers=integers["block_count"],
        num_heads=heads,
        num_kv_heads=integers["attention.head_count_kv"] or heads,
        head_dim=head_dim,
        rope_theta=float(g.value("{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(g.value("{arch}.attention.layer_norm_rms_epsilon")),
        qkv_bias=g.arch == "qwen2",
        qk_norm=g.arch == "qwen3",
        tie_word_embeddings="output.weight" not in g.tensors,
        max_position_embeddings=integers["context_length"],
    )


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor of these architectures, or None."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_TENSORS:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_TENSORS[part]}.{kind}"


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's layout of a llama q/k projection [out, ...]: within each head it stores
    row pairs (i, i + head_dim / 2) next to each other; Hugging Face keeps the halves apart."""
    rows = w.shape[0]
    return (
        w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _tensor_plan(g: _Gguf, cfg: QwenConfig) -> dict[str, tuple[str, int | None]]:
    """HF name -> (GGUF name, heads to unpermute or None) for every tensor, checked against the
    architecture: missing, unexpected or misshaped tensors and unsupported types raise."""
    expected = hf_tensor_shapes(cfg)
    plan = {}
    for name, tensor in g.tensors.items():
        hf = hf_tensor_name(name)
        if hf not in expected:
            raise CheckpointError(f"{g.path}: unexpected tensor {name} for {cfg.model_type}")
        if g.shape(name) != expected[hf]:
            raise CheckpointError(
                f"{g.path}: tensor {name} has shape {g.shape(name)}, the metadata implies "
                f"{expected[hf]}"
            )
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise CheckpointError(
                f"{g.path}: tensor {name} has quantization type {tensor.tensor_type.name}, which "
                f"is not supported (supported: {', '.join(t.name for t in SUPPORTED_TYPES)})"
            )
        heads = None
        if cfg.model_type == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_heads if "q_proj" in hf else cfg.num_kv_heads
        plan[hf] = (name, heads)
    missing = sorted(set(expected) - set(plan))
    if missing:
        raise CheckpointError(f"{g.path}: tensor for {missing[0]} is missing")
    return plan


def _write_weights(g: _Gguf, plan: dict[str, tuple[str, int | None]], out: str, dtype: Any):
    """Dequantizes every tensor, one at a time, into out's safetensors file(s)."""

    def produce(hf: str) -> np.ndarray:
        name, heads = plan[hf]
        tensor = g.tensors[name]
        w = dequantize(tensor.data, tensor.tensor_type, g.shape(name))
        return (unpermute_rope_rows(w, heads) if heads else w).astype(dtype)

    specs = [(hf, g.shape(plan[hf][0]), dtype) for hf in sorted(plan)]
    write_sharded(out, specs, produce)


def _token(g: _Gguf, key: str, tokens: list[str]) -> str | None:
    """The text of the token whose id the metadata `key` gives, or None."""
    token_id = g.value(key, None)
    return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None


def tokenizer_files(g: _Gguf, cfg: QwenConfig) -> dict[str, Any]:
    """tokenizer.json, tokenizer_config.json and generation_config.json contents, from the
    file's tokenizer metadata; raises CheckpointError if its tokenizer is not supported."""
    model, pre = g.value("tokenizer.ggml.model"), g.value("tokenizer.ggml.pre", "default")
    if model != "gpt2":
        raise CheckpointError(f"{g.path}: tokenizer model {model!r} is not supported (gpt2 BPE)")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(
            f"{g.path}: pre-tokenizer {pre!r} is not supported (supported: "
            f"{', '.join(PRE_TOKENIZERS)})"
        )
    tokens = g.value("tokenizer.ggml.tokens")
    types = g.value("tokenizer.ggml.token_type")
    if len(set(tokens)) != len(tokens) or len(types) != len(tokens):
        raise CheckpointError(f"{g.path}: the token list has duplicates or mismatched types")
    normalizer, pre_tokenizer = PRE_TOKENIZERS[pre]
    bos = _token(g, "tokenizer.ggml.bos_token_id", tokens)
    add_bos = bool(g.value("tokenizer.ggml.add_bos_token", False)) and bos is not None
    post_processor = None
    if add_bos:
        special = {"SpecialToken": {"id": bos, "type_id": 0}}
        post_processor = {
            "type": "TemplateProcessing",
            "single": [special, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                special,
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [tokens.index(bos)], "tokens": [bos]}},
        }
    added = [
        {
            "id": i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind == _CONTROL,
        }
        for i, (token, kind) in enumerate(zip(tokens, types))
        if kind in (_CONTROL, _USER_DEFINED)
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {token: i for i, token in enumerate(tokens)},
            "merges": [merge.split(" ", 1) for merge in g.value("tokenizer.ggml.merges", [])],
        },
    }
    specials = {
        "bos_token": bos,
        "eos_token": _token(g, "tokenizer.ggml.eos_token_id", tokens),
        "pad_token": _token(g, "tokenizer.ggml.padding_token_id", tokens),
        "unk_token": _token(g, "tokenizer.ggml.unknown_token_id", tokens),
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_position_embeddings,
        **{k: v for k, v in specials.items() if v is not None},
    }
    generation = {
        key: g.value(f"tokenizer.ggml.{field}_token_id", None)
        for key, field in (
            ("bos_token_id", "bos"),
            ("eos_token_id", "eos"),
            ("pad_token_id", "padding"),
        )
    }
    generation = {k: v for k, v in generation.items() if v is not None}
    return {
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": config,
        "generation_config.json": generation,
    }


def chat_template(g: _Gguf) -> str | None:
    """The chat template to write: the file's own, with SmolLM2's tool convention in front when
    it is ChatML without a tools section (module docstring); None when the file has none."""
    from environments.toolcall import SMOLLM2_TOOLS_FOOTER, SMOLLM2_TOOLS_HEADER

    own = g.value("tokenizer.chat_template", None)
    if own is None or "tools" in own or "<|im_start|>" not in own:
        return own
    header = (
        f"{{%- set tools_header = {json.dumps(SMOLLM2_TOOLS_HEADER)} %}}\n"
        f"{{%- set tools_footer = {json.dumps(SMOLLM2_TOOLS_FOOTER)} %}}\n"
    )
    return header + TOOLS_TEMPLATE.read_text().rstrip("\n") + own


def import_gguf(gguf_path: str, out: str, dtype: str = "float32") -> QwenConfig:
    """Writes the Hugging Face directory of a GGUF file (module docstring) at `out`.

    Args:
      gguf_path: the .gguf file.
      out: the directory to create (it may exist if it is empty); written whole or not at all.
      dtype: "float32" (the dequantized values exactly) or "bfloat16" for the weights.
    Returns:
      The architecture written.
    Raises:
      CheckpointError: a missing or corrupt file, unsupported architecture, tokenizer, tensor
        or quantization type, or an `out` that is not empty; the message names the problem.
    """
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise CheckpointError(f"{out} exists and is not an empty directory")
    start = time.perf_counter()
    g = _Gguf(gguf_path)
    cfg = read_config(g)
    plan = _tensor_plan(g, cfg)
    files = tokenizer_files(g, cfg)
    template = chat_template(g)
    types = sorted({g.tensors[name].tensor_type.name for name, _ in plan.values()})
    logging.info(
        "%s: %s, %d layers, hidden %d, %d/%d heads, vocabulary %d, %s embeddings; %d tensors "
        "(%s); read in %.1f s",
        gguf_path,
        cfg.model_type,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.vocab_size,
        "tied" if cfg.tie_word_embeddings else "untied",
        len(plan),
        ", ".join(types),
        time.perf_counter() - start,
    )
    tmp = f"{out.rstrip(os.sep)}.partial-{os.getpid()}"
    try:
        _write_weights(g, plan, tmp, DTYPES[dtype])
        logging.info("dequantized to %s in %.1f s", dtype, time.perf_counter() - start)
        config = hf_config_dict(cfg, dtype)
        config.update(files["generation_config.json"])
        QwenConfig.from_hf_dict(config, source=f"{gguf_path} (converted config)")
        for name, content in [("config.json", config), *files.items()]:
            with open(os.path.join(tmp, name), "w") as f:
                json.dump(content, f, indent=2, ensure_ascii=False)
        if template is not None:
            Path(tmp, "chat_template.jinja").write_text(template)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logging.info("wrote %s in %.1f s", out, time.perf_counter() - start)
    return cfg


_GGUF = flags.DEFINE_string("gguf", None, "The .gguf file to import.")
_OUT = flags.DEFINE_string("out", None, "The Hugging Face directory to write (new or empty).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(DTYPES), "dtype of the written weights.")


def _fail(message: str) -> None:
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
    try:
        rest = flags.FLAGS(argv)
    except flags.Error as e:
        _fail(re.sub(r"^Error: ", "", str(e)))
    if not _GGUF.value or not _OUT.value:
        _fail("--gguf=FILE and --out=DIR are required")
    return rest


def main(argv: list[str]) -> None:
    """Imports --gguf into --out; one error line and exit code 2 on bad input."""
    if len(argv) > 1:
        _fail(f"unexpected argument(s) {' '.join(argv[1:])!r}: flags are --name=value")
    try:
        import_gguf(_GGUF.value, _OUT.value, _DTYPE.value)
    except (CheckpointError, OSError) as e:
        _fail(str(e))


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)

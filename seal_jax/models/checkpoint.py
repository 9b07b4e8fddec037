"""Hugging Face checkpoint I/O: safetensors straight into sharded arrays, and export back.

Loading never builds the full model on one device: each parameter is created with
`jax.make_array_from_callback`, whose callback reads (through a memory map) only the slice that
one addressable device holds. Export gathers one layer of one tensor at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from seal_jax import sharding
from seal_jax.models import architectures
from seal_jax.models.config import CheckpointError, Qwen35Config, QwenConfig, architecture_from_dir
from seal_jax.models.safetensors_io import SafetensorsFile, open_checkpoint, write_sharded

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "tokenizer.model",
)
# Tensors some checkpoints carry that the computation does not need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Parts of a Qwen3.5 checkpoint that are not its language model: the vision tower and the
# multi-token-prediction head (transformers' Qwen3_5ForCausalLM skips them too).
_QWEN35_OTHER_PREFIXES = ("model.visual.", "mtp.")
# Qwen3.5 parameters that are checkpoint tensors under their own name (no `.weight`).
_QWEN35_BARE = ("A_log", "dt_bias")
# The transformers class of each model type, for a config.json written from the fields alone.
_ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
}


@dataclasses.dataclass(frozen=True)
class _HFTensor:
    """Where one parameter leaf lives in a HF checkpoint."""

    names: tuple[str, ...]  # one per layer for stacked parameters, else one
    transpose: bool  # HF Linear weights are [out, in]; Flax kernels are [in, out]


def _hf_tensor(path: tuple[str, ...], num_layers: int) -> _HFTensor:
    """HF tensor name(s) of the Flax parameter at `path`."""
    if path == ("lm_head",):
        return _HFTensor(("lm_head.weight",), True)
    *mid, leaf = path
    suffix = "bias" if leaf == "bias" else "weight"
    if mid[0] == "layers":
        rest = ".".join(mid[1:])
        names = tuple(f"model.layers.{i}.{rest}.{suffix}" for i in range(num_layers))
        return _HFTensor(names, leaf == "kernel")
    return _HFTensor((f"model.{'.'.join(mid)}.{suffix}",), leaf == "kernel")


def _hf_tensor_qwen35(path: tuple[str, ...], cfg: Qwen35Config, prefix: str) -> _HFTensor:
    """HF tensor name(s) of the Qwen3.5 parameter at `path`: pattern position j of the layer
    scan (`layers/l{j}/...`, see `qwen35`) holds HF layers j, j + p, j + 2p, ... (p the length of
    the pattern); the text model's tensors start with `prefix`."""
    if path == ("lm_head",):
        return _HFTensor(("lm_head.weight",), True)
    *mid, leaf = path
    name = ".".join([*mid, leaf if leaf in _QWEN35_BARE else "weight"])
    if mid[0] != "layers":
        return _HFTensor((prefix + name,), leaf == "kernel")
    p = len(cfg.layer_pattern)
    j, rest = int(mid[1][1:]), name.split(".", 2)[2]
    names = tuple(f"{prefix}layers.{g * p + j}.{rest}" for g in range(cfg.num_layers // p))
    return _HFTensor(names, leaf == "kernel")


def tensor_names(
    cfg: QwenConfig | Qwen35Config, prefix: str | None = None
) -> Callable[[tuple[str, ...]], _HFTensor]:
    """Maps a parameter path to its HF tensor(s) for the architecture; prefix (Qwen3.5 only):
    where the text model's tensors live (default: where the loaded checkpoint had them)."""
    if isinstance(cfg, Qwen35Config):
        return functools.partial(
            _hf_tensor_qwen35, cfg=cfg, prefix=cfg.weight_prefix if prefix is None else prefix
        )
    return functools.partial(_hf_tensor, num_layers=cfg.num_layers)


def _leaf_paths(tree: Any) -> list[tuple[tuple[str, ...], Any]]:
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return [(tuple(str(k.key) for k in p), x) for p, x in leaves]


def param_shapes(cfg: QwenConfig | Qwen35Config, dtype: Any = jnp.float32) -> Any:
    """The parameter pytree as ShapeDtypeStructs (no memory allocated)."""
    return jax.eval_shape(
        functools.partial(architectures.init_params, cfg, param_dtype=dtype), jax.random.key(0)
    )


def hf_tensor_shapes(cfg: QwenConfig | Qwen35Config) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor the architecture needs (lm_head.weight only when untied), by
    name, with its shape in the checkpoint's layout."""
    shapes = {}
    names_of = tensor_names(cfg)
    for path, leaf in _leaf_paths(param_shapes(cfg)):
        hf = names_of(path)
        own = leaf.shape[1:] if path[0] == "layers" else leaf.shape
        for name in hf.names:
            shapes[name] = tuple(reversed(own)) if hf.transpose else tuple(own)
    return shapes


def _check_tensors(cfg: QwenConfig | Qwen35Config, tensors: dict[str, SafetensorsFile]) -> None:
    """Raises CheckpointError for a missing, misshaped or unexpected tensor, naming its file."""
    expected = hf_tensor_shapes(cfg)
    for name, want in expected.items():
        if name not in tensors:
            raise CheckpointError(f"checkpoint is missing tensor {name}")
        got = tensors[name].shape(name)
        if got != want:
            raise CheckpointError(
                f"{tensors[name].path}: tensor {name} has shape {got}, config.json implies {want}"
            )
    others = [
        n for n in tensors if isinstance(cfg, Qwen35Config) and n.startswith(_QWEN35_OTHER_PREFIXES)
    ]
    if others:
        logging.info(
            "qwen3_5 checkpoint: loading the language model; ignoring %d vision-tower / "
            "multi-token-prediction tensors (%s...)",
            len(others),
            others[0],
        )
    for name, f in tensors.items():
        benign = (
            name.endswith(_IGNORED_SUFFIXES)
            or (name == "lm_head.weight" and cfg.tie_word_embeddings)
            or name in others
        )
        if name not in expected and not benign:
            raise CheckpointError(
                f"{f.path}: unexpected tensor {name} (the checkpoint's architecture does not "
                "match config.json)"
            )


def _reader(hf: _HFTensor, tensors: dict[str, SafetensorsFile], stacked: bool, dtype: Any):
    """Callback for make_array_from_callback: reads one device's slice from the memory maps."""

    def one(name: str, index: tuple[slice, ...]) -> np.ndarray:
        src = tensors[name].array(name)
        return (src.T if hf.transpose else src)[index]

    def read(index: tuple[slice, ...]) -> np.ndarray:
        if stacked:
            layers = range(len(hf.names))[index[0]]
            out = np.stack([one(hf.names[i], index[1:]) for i in layers])
        else:
            out = one(hf.names[0], index)
        return out.astype(dtype)

    return read


@dataclasses.dataclass
class LoadedModel:
    """A Qwen or Llama checkpoint loaded onto a mesh.

    Attributes:
      config: the architecture (QwenConfig, or Qwen35Config for Qwen3.5; includes the original
        config.json as hf_config).
      params: parameter pytree of jax.Arrays, each with a NamedSharding on `mesh`.
      mesh: the device mesh the parameters live on.
      path: the directory it was loaded from.
      compute_dtype: dtype of activations/matmuls used by `logits` and `token_logprobs`.
    """

    config: QwenConfig | Qwen35Config
    params: Any
    mesh: Mesh
    path: str
    compute_dtype: Any = jnp.float32

    def logits(self, input_ids: Any, positions: Any, mask: Any) -> jax.Array:
        """float32 logits [B, T, V] for int arrays input_ids, positions and mask [B, T]."""
        fn = jax.jit(
            functools.partial(
                architectures.forward_logits, cfg=self.config, dtype=self.compute_dtype
            )
        )
        with jax.set_mesh(self.mesh):
            logits, _ = fn(
                self.params,
                input_ids=jnp.asarray(input_ids),
                positions=jnp.asarray(positions),
                mask=jnp.asarray(mask),
            )
        return logits

    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer (with its chat template), from local files only."""
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{self.path}: cannot load the tokenizer ({e})") from None


def load_hf_checkpoint(
    path: str,
    *,
    mesh: Mesh | None = None,
    dtype: Any = jnp.float32,
    compute_dtype: Any = None,
) -> LoadedModel:
    """Loads a Hugging Face Qwen2/Qwen2.5/Qwen3/Qwen3.5/Llama 3 safetensors directory onto a
    device mesh (of a Qwen3.5 vision-language checkpoint, the language model).

    Args:
      path: local directory with config.json and model.safetensors (or sharded files with
        model.safetensors.index.json). Nothing is downloaded.
      mesh: a (data, fsdp, tensor) mesh from `seal_jax.sharding.make_mesh`; default one device.
      dtype: parameter dtype (float32 or bfloat16); the checkpoint's values are cast to it.
      compute_dtype: activation dtype for `LoadedModel.logits`; defaults to `dtype`.

    Returns:
      LoadedModel with `.config`, `.params` (sharded by `seal_jax.sharding.PARAM_RULES`), `.mesh`,
      `.logits(input_ids, positions, mask) -> [B, T, V] float32` and `.tokenizer()`.

    Raises:
      CheckpointError: missing directory/config/shard, truncated or corrupt file, shape mismatch,
        unknown or unsupported architecture; the message names the file and the problem.
    """
    cfg = architecture_from_dir(path)
    tensors = open_checkpoint(path)
    mesh = mesh or sharding.single_device_mesh()
    shapes = param_shapes(cfg, dtype)
    _check_tensors(cfg, tensors)
    shardings = sharding.param_shardings(shapes, mesh)
    names_of = tensor_names(cfg)

    def load_leaf(path_keys: tuple[Any, ...], leaf: Any, shard: Any) -> jax.Array:
        keys = tuple(str(k.key) for k in path_keys)
        hf = names_of(keys)
        read = _reader(hf, tensors, keys[0] == "layers", leaf.dtype)
        return jax.make_array_from_callback(leaf.shape, shard, read)

    params = jax.tree_util.tree_map_with_path(load_leaf, shapes, shardings)
    return LoadedModel(cfg, params, mesh, path, compute_dtype or dtype)


def _to_host(x: jax.Array) -> np.ndarray:
    """The full value of x on this host (gathered across processes when needed)."""
    if jax.process_count() > 1 and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def hf_config_dict(cfg: QwenConfig | Qwen35Config, dtype_name: str) -> dict[str, Any]:
    """config.json content for `cfg`: the loaded one when known, else built from the fields."""
    if isinstance(cfg, Qwen35Config):
        return _qwen35_config_dict(cfg, dtype_name)
    d = dict(cfg.hf_config) or {
        "model_type": cfg.model_type,
        "architectures": [_ARCHITECTURES[cfg.model_type]],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
    }
    if cfg.model_type in ("qwen3", "llama"):
        d.setdefault("attention_bias", cfg.qkv_bias)
    if not cfg.hf_config and cfg.rope_scaling is not None:
        d["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)}
    d["dtype"] = dtype_name
    d.pop("torch_dtype", None)
    return d


def _qwen35_config_dict(cfg: Qwen35Config, dtype_name: str) -> dict[str, Any]:
    """config.json of a text-only Qwen3.5 causal LM (`qwen3_5_text`, Qwen3_5ForCausalLM): the
    loaded text config, or one built from the fields."""
    d = dict(cfg.hf_config) or {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rotary_dim / cfg.head_dim,
        },
        "layer_types": list(cfg.layer_types),
        "linear_conv_kernel_dim": cfg.conv_kernel,
        "linear_num_key_heads": cfg.linear_num_key_heads,
        "linear_num_value_heads": cfg.linear_num_value_heads,
        "linear_key_head_dim": cfg.linear_key_head_dim,
        "linear_value_head_dim": cfg.linear_value_head_dim,
    }
    d.update(
        model_type="qwen3_5_text",
        architectures=["Qwen3_5ForCausalLM"],
        tie_word_embeddings=cfg.tie_word_embeddings,
        dtype=dtype_name,
    )
    d.pop("torch_dtype", None)
    return d


def save_hf_checkpoint(
    path: str,
    params: Any,
    config: QwenConfig,
    *,
    dtype: str = "bfloat16",
    tokenizer_dir: str | None = None,
    max_shard_bytes: int = 4 * 1024**3,
) -> None:
    """Writes params as a Hugging Face directory that transformers and vLLM load.

    Args:
      path: output directory (created).
      params: parameter pytree (possibly sharded, possibly across processes: every process must
        call this; only process 0 writes).
      config: the architecture; its original config.json is reused when it was loaded from one
        (a Qwen3.5 model is written as the text-only causal LM, `qwen3_5_text`).
      dtype: "bfloat16", "float16" or "float32" for the saved tensors.
      tokenizer_dir: directory whose tokenizer / chat-template / generation files are copied.
      max_shard_bytes: above this the weights are split into shards with an index file.
    """
    np_dtype = np.dtype(jnp.dtype(dtype))
    leaves = {keys: leaf for keys, leaf in _leaf_paths(params)}
    entries = []  # (hf name, hf shape, source leaf path, layer index or None)
    names_of = tensor_names(config, prefix="model.")
    for keys, leaf in leaves.items():
        hf = names_of(keys)
        stacked = keys[0] == "layers"
        own = leaf.shape[1:] if stacked else leaf.shape
        shape = tuple(reversed(own)) if hf.transpose else tuple(own)
        for i, name in enumerate(hf.names):
            entries.append((name, shape, keys, i if stacked else None, hf.transpose))
    entries.sort(key=lambda e: e[0])

    by_name = {e[0]: e for e in entries}

    def produce(name: str) -> np.ndarray:
        _, _, keys, layer, transpose = by_name[name]
        leaf = leaves[keys]
        arr = _to_host(leaf[layer] if layer is not None else leaf)
        return (arr.T if transpose else arr).astype(np_dtype)

    writer = jax.process_index() == 0
    specs = [(e[0], e[1], np_dtype) for e in entries]
    write_sharded(path, specs, produce, max_shard_bytes, write=writer)
    if not writer:
        return
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config_dict(config, str(np_dtype)), f, indent=2)
    if tokenizer_dir:
        for fname in TOKENIZER_FILES:
            src = os.path.join(tokenizer_dir, fname)
            if os.path.isfile(src):
                shutil.copy(src, os.path.join(path, fname))

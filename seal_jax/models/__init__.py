"""Policy models (Qwen2, Qwen3, Qwen3.5, Llama 3): architecture config, Flax module, Hugging Face
checkpoint I/O."""

from seal_jax.models.checkpoint import LoadedModel, load_hf_checkpoint, save_hf_checkpoint
from seal_jax.models.config import CheckpointError, Llama3RopeScaling, Qwen35Config, QwenConfig
from seal_jax.models.qwen import (
    Qwen,
    forward_logits,
    init_cache,
    init_params,
    token_logprobs,
)

__all__ = [
    "CheckpointError",
    "Llama3RopeScaling",
    "LoadedModel",
    "Qwen",
    "Qwen35Config",
    "QwenConfig",
    "forward_logits",
    "init_cache",
    "init_params",
    "load_hf_checkpoint",
    "save_hf_checkpoint",
    "token_logprobs",
]

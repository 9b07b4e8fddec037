"""Policy models (Qwen2, Qwen3, Qwen3.5, Llama 3): architecture config, Flax module, Hugging Face
checkpoint I/O."""

from seal_jax.models.architectures import (
    forward_logits,
    init_cache,
    init_params,
    model_class,
    token_logprobs,
)
from seal_jax.models.checkpoint import LoadedModel, load_hf_checkpoint, save_hf_checkpoint
from seal_jax.models.config import CheckpointError, Llama3RopeScaling, Qwen35Config, QwenConfig
from seal_jax.models.qwen35 import Qwen35
from seal_jax.models.qwen_llama import DenseDecoder

__all__ = [
    "CheckpointError",
    "Llama3RopeScaling",
    "LoadedModel",
    "DenseDecoder",
    "Qwen35",
    "Qwen35Config",
    "QwenConfig",
    "forward_logits",
    "init_cache",
    "init_params",
    "load_hf_checkpoint",
    "model_class",
    "save_hf_checkpoint",
    "token_logprobs",
]

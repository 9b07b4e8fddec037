"""The Flax Qwen model against the transformers torch implementation on padded batches."""

import numpy as np
import pytest

from seal_jax.models import load_hf_checkpoint
from tests import hf_models


@pytest.mark.parametrize("variant", list(hf_models.VARIANTS))
def test_float32_logits_match_torch(tiny_checkpoints, variant):
    path, torch_model = tiny_checkpoints[variant]
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size)
    expected = hf_models.torch_logits(torch_model, ids, positions, mask)
    got = np.asarray(load_hf_checkpoint(path).logits(ids, positions, mask))
    valid = mask.astype(bool)
    assert np.abs(got[valid] - expected[valid]).max() <= 1e-4

"""The Flax Qwen model against the transformers torch implementation on padded batches."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from seal_jax.models import load_hf_checkpoint
from tests import hf_models
from tests.devices import run_with_devices

VARIANTS = list(hf_models.VARIANTS)


def _reference(torch_model):
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size)
    return (ids, positions, mask), hf_models.torch_logits(torch_model, ids, positions, mask)


@pytest.mark.parametrize("variant", VARIANTS)
def test_float32_logits_match_torch(tiny_checkpoints, variant):
    path, torch_model = tiny_checkpoints[variant]
    (ids, positions, mask), expected = _reference(torch_model)
    got = np.asarray(load_hf_checkpoint(path).logits(ids, positions, mask))
    valid = mask.astype(bool)
    assert np.abs(got[valid] - expected[valid]).max() <= 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16])
def test_bfloat16_compute_close_to_torch_float32(tiny_checkpoints, variant, param_dtype):
    # bf16 keeps 8 significant bits (relative rounding <= 2^-9). About a dozen roundings lie on the
    # path to a logit (embedding, per layer: norm, q/k/v, scores, o, MLP; final norm, head), each
    # contributing error proportional to |logit| (<= ~2.6 here): we allow 0.1 at most and 0.02 on
    # average, and the argmax must agree almost everywhere.
    path, torch_model = tiny_checkpoints[variant]
    (ids, positions, mask), expected = _reference(torch_model)
    model = load_hf_checkpoint(path, dtype=param_dtype, compute_dtype=jnp.bfloat16)
    got = np.asarray(model.logits(ids, positions, mask))
    valid = mask.astype(bool)
    diff = np.abs(got[valid] - expected[valid])
    assert diff.max() <= 0.1 and diff.mean() <= 0.02
    assert (got.argmax(-1) == expected.argmax(-1))[valid].mean() >= 0.9
    # And it is genuinely bf16: exact float32 agreement would mean the dtype was ignored.
    assert diff.max() > 1e-4


SHARDED = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from seal_jax.models import load_hf_checkpoint
from seal_jax.sharding import make_mesh
from tests import hf_models
path, dtype = sys.argv[1], sys.argv[2]
ids, positions, mask = hf_models.padded_batch(json.load(open(path + "/config.json"))["vocab_size"])
mesh = make_mesh(data=4, fsdp=1, tensor=2)
model = load_hf_checkpoint(path, mesh=mesh, dtype=jnp.float32, compute_dtype=jnp.dtype(dtype))
q = model.params["layers"]["self_attn"]["q_proj"]["kernel"]
assert len(jax.devices()) == 8 and tuple(q.sharding.spec) == (None, "fsdp", "tensor"), q.sharding
assert len({s.device for s in q.addressable_shards}) == 8
np.save(sys.argv[3], np.asarray(model.logits(ids, positions, mask), np.float32))
"""


@pytest.mark.parametrize("variant", ["qwen2_untied", "qwen3"])
def test_sharded_4x2_mesh_matches_torch(tiny_checkpoints, variant, tmp_path):
    path, torch_model = tiny_checkpoints[variant]
    (ids, positions, mask), expected = _reference(torch_model)
    valid = mask.astype(bool)
    for dtype, tol in (("float32", 1e-4), ("bfloat16", 0.1)):
        out = tmp_path / f"{dtype}.npy"
        code = f"import sys; sys.argv = ['x', {path!r}, {dtype!r}, {str(out)!r}]\n" + SHARDED
        run_with_devices(code, num_devices=8)
        got = np.load(out)
        assert np.abs(got[valid] - expected[valid]).max() <= tol


def test_config_fields_are_read_from_checkpoint(tiny_checkpoints):
    path, torch_model = tiny_checkpoints["qwen3"]
    cfg = load_hf_checkpoint(path).config
    with open(f"{path}/config.json") as f:
        raw = json.load(f)
    assert cfg.head_dim == raw["head_dim"] == 24 != cfg.hidden_size // cfg.num_heads
    assert cfg.rope_theta == 5000.0 and cfg.rms_norm_eps == 1e-5
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.qk_norm, cfg.qkv_bias) == (4, 2, True, False)

"""fp32 master weights: one step with the paper's optimizer moves (nearly) every weight of a
decoder layer, where bfloat16 storage would round most updates away, and the config refuses
bfloat16 parameters at such a learning rate."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.qwen import get_config
from seal_jax import config as config_lib
from seal_jax import optim, sft, sharding, train_step
from seal_jax.models import QwenConfig, init_params

# One decoder layer of Qwen2.5-0.5B's width. Adam moves each entry by about lr whatever the width,
# and weights start at the same scale (std 0.02), so what bfloat16 rounds away does not depend on
# the width (7B's gave the same conclusion in 66 s against 14 s). A small vocabulary that one
# sequence covers entirely (an embedding row no token reads gets no gradient).
CFG = QwenConfig(
    model_type="qwen2",
    vocab_size=128,
    hidden_size=896,
    intermediate_size=4864,
    num_layers=1,
    num_heads=14,
    num_kv_heads=2,
    head_dim=64,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    qkv_bias=True,
    qk_norm=False,
    tie_word_embeddings=False,
    max_position_embeddings=1024,
)


def changed_fraction_after_one_step(param_dtype):
    """{parameter path: fraction of its entries that one paper-optimizer step changed}."""
    mesh = sharding.single_device_mesh()
    params = init_params(CFG, jax.random.key(0), param_dtype=param_dtype)
    params = jax.device_put(params, sharding.param_shardings(params, mesh))
    before = jax.tree.map(np.asarray, params)
    loss = functools.partial(
        sft._cross_entropy, cfg=CFG, dtype=jnp.bfloat16, chunk=128, scan_unroll=1
    )
    step, init = train_step.make_update_step(
        loss, optim.make_optimizer(get_config().optim), params, mesh
    )
    ids = np.random.default_rng(0).permutation(CFG.vocab_size).astype(np.int32)[None]
    batch = {
        "input_ids": ids,
        "positions": np.arange(ids.shape[1], dtype=np.int32)[None],
        "mask": np.ones(ids.shape, bool),
        "targets": np.roll(ids, -1, axis=1),
        "loss_mask": np.ones(ids.shape, bool),
    }
    with jax.set_mesh(mesh):
        params, _, _ = step(params, init(params), batch)
    after = jax.tree.map(np.asarray, params)
    flat = jax.tree_util.tree_flatten_with_path(before)[0]
    return {
        sharding.path_str(path): float(np.mean(a != b))
        for (path, a), b in zip(flat, jax.tree.leaves(after), strict=True)
    }


def test_fp32_master_weights_change_every_parameter_kind_at_the_paper_lr():
    assert get_config().optim.lr == 1e-6 and get_config().model.param_dtype == "float32"
    fractions = changed_fraction_after_one_step(jnp.float32)
    assert len(fractions) == 15  # embed, 3 norms, q/k/v kernels and biases, o, 3 mlp, head
    # The key bias shifts every key of a query alike, which softmax ignores up to RoPE's
    # rotation: its slowest-rotating entries get (next to) no gradient.
    key_bias = fractions.pop("layers/self_attn/k_proj/bias")
    assert min(fractions.values()) >= 0.99 and key_bias >= 0.95, (key_bias, fractions)


def test_bfloat16_storage_loses_most_updates_and_the_config_refuses_it():
    fractions = changed_fraction_after_one_step(jnp.bfloat16)
    kernels = [f for path, f in fractions.items() if path.endswith("kernel")]
    assert max(kernels) < 0.2, fractions  # what an fp32-free run would silently train
    c = get_config()
    c.model.param_dtype = "bfloat16"
    with pytest.raises(config_lib.ConfigError, match="cannot learn at --config.optim.lr=1e-06"):
        config_lib.validate(c)
    c.optim.lr = 1e-4  # above bfloat16's resolution at 0.02: allowed
    config_lib.validate(c)

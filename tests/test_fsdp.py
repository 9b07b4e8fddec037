"""FSDP holds in the compiled update: activations keep the batch split through every layer, each
layer's weights are gathered instead, and per-device memory does not grow with the device count
at a fixed number of rows per device (4 and 8 simulated CPU devices, compiled ahead of time)."""

import json

from tests.devices import run_with_devices

HIDDEN, MLP, LENGTH = 256, 1024, 256

PROGRAM = f"""
import json
import jax, jax.numpy as jnp
from configs.qwen import get_config
from seal_jax import aot, sharding, update
from seal_jax.models import QwenConfig

n = jax.device_count()
cfg = QwenConfig(model_type="qwen2", vocab_size=2048, hidden_size={HIDDEN},
    intermediate_size={MLP}, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
    rope_theta=1e6, rms_norm_eps=1e-6, qkv_bias=True, qk_norm=False,
    tie_word_embeddings=False, max_position_embeddings=4096)
c = get_config()  # the paper's setting: FSDP over every device, fp32 params, bf16 compute, remat
c.train.mini_batch_tasks, c.rl.group_size, c.optim.grad_accum = n, 1, 1  # one row per device
c.model.attn_chunk = c.model.logprob_chunk = 128
model = aot.abstract_model(cfg, sharding.make_mesh(1, n, 1), jnp.float32, jnp.bfloat16)
updater = update.build_updater(c, model)
memory, compiled = aot.compile_memory("update", *aot.lower_update(updater, model, {LENGTH}))
gathers = [shape for (op, shape), _ in aot.collectives(compiled.as_text()).items()
           if op == "all-gather"]
print(json.dumps({{"temp": memory.temp_bytes, "gathers": gathers}}))
"""


def _compile(devices):
    return json.loads(run_with_devices(PROGRAM, devices).strip().splitlines()[-1])


def test_update_gathers_weights_not_activations_and_memory_stays_flat():
    four, eight = _compile(4), _compile(8)
    for result, n in ((four, 4), (eight, 8)):
        gathers = set(result["gathers"])
        # each layer's MLP and attention weights, gathered whole (just in time, in the layer scan)
        assert {
            f"f32[{HIDDEN},{MLP}]",
            f"f32[{MLP},{HIDDEN}]",
            f"f32[{HIDDEN},{HIDDEN}]",
        } <= gathers
        # no hidden states gathered over the global batch
        assert not [g for g in gathers if g.startswith(f"f32[{n},{LENGTH},")], gathers
        assert not [g for g in gathers if g.startswith(f"bf16[{n},{LENGTH},")], gathers
    assert eight["temp"] <= 1.05 * four["temp"], (four["temp"], eight["temp"])

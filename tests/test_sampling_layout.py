"""The sampling layout (seal_jax/weight_sync.py) on 8 simulated CPU devices: the copy holds the
trainer's values in the compute dtype, laid out tensor-parallel per group and replicated across
groups; greedy rollouts from it equal rollouts from the trainer's FSDP layout; and the compiled
decode program gathers no weight inside its token loop, where the FSDP layout gathers them all."""

import json

import numpy as np

from tests.devices import run_with_devices

PROGRAM = """
import json
import jax, jax.numpy as jnp, numpy as np
from seal_jax import aot, sharding, weight_sync
from seal_jax.models import LoadedModel, QwenConfig
from seal_jax.models import init_params
from seal_jax.rollout import EngineConfig, RolloutEngine

cfg = QwenConfig(model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128,
    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e6, rms_norm_eps=1e-6,
    qkv_bias=True, qk_norm=False, tie_word_embeddings=False, max_position_embeddings=512)
train_mesh = sharding.make_mesh(1, 8, 1)
params = init_params(cfg, jax.random.key(0))
params = jax.device_put(params, sharding.param_shardings(params, train_mesh))
# Prefill pieces of 16 and a context the second turn's cache (96 slots) fills: fewer programs,
# and the decode program compiled for the gather count is the second turn's, already compiled.
settings = EngineConfig(context_limit=96, max_new_tokens=24, stop_ids=(511,), prefill_chunk=16,
                        decode_segment=8, min_cache_len=32, min_prefill_width=16)
rng = np.random.default_rng(0)
prompts = [rng.integers(0, 510, n).tolist() for n in (5, 17, 9, 30)]

def rollout(engine, p):
    r = engine.start(engine.sampling_params(p), prompts, num_samples=2)
    r.generate()
    r.generate({row: [7, 8, 9] for row in r.live_rows()})
    return [s.token_ids.tolist() for s in r.sequences()]

def decode_gathers(engine):
    class C: pass
    config = C(); config.rollout = C(); config.train = C(); config.rl = C()
    config.rollout.context_limit, config.rollout.micro_batch_tasks = 96, 4
    config.rollout.slots = 0
    config.train.batch_tasks, config.rl.group_size = 4, 2
    model = LoadedModel(cfg, aot._with_shardings(
        jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params),
        jax.tree.map(lambda x: x.sharding, params)), train_mesh, "", jnp.float32)
    lowered = aot.lower_rollout(config, model, engine)
    low, _ = lowered["rollout_decode"]
    return aot.weight_gathers_per_token(low.compile().as_text(), lowered["rollout_decode"][1][0])

layout = weight_sync.sampling_layout(4, jnp.bfloat16)
copy = layout.copy(params)
fsdp = RolloutEngine(cfg, train_mesh, settings)
tp = RolloutEngine(cfg, layout.mesh, settings,
                   layout=weight_sync.sampling_layout(4, jnp.float32))
leaf = copy["layers"]["mlp"]["gate_proj"]["kernel"]
print(json.dumps({
    "copy_dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(copy)}),
    "copy_equal": all(bool(jnp.all(c == p.astype(jnp.bfloat16)))
                      for c, p in zip(jax.tree.leaves(copy), jax.tree.leaves(params))),
    "gate_shard": leaf.sharding.shard_shape(leaf.shape), "mesh": dict(layout.mesh.shape),
    "fsdp_ids": rollout(fsdp, params), "tp_ids": rollout(tp, params),
    "fsdp_gathers": decode_gathers(fsdp), "tp_gathers": decode_gathers(tp),
}))
"""


def test_sampling_copy_rollouts_and_decode_gathers():
    r = json.loads(run_with_devices(PROGRAM, 8).strip().splitlines()[-1])
    assert r["copy_dtypes"] == ["bfloat16"] and r["copy_equal"]
    assert r["mesh"] == {"data": 2, "fsdp": 1, "tensor": 4}
    assert r["gate_shard"] == [2, 64, 128 // 4]  # [layers, embed, mlp]: the MLP split in 4
    assert r["tp_ids"] == r["fsdp_ids"]
    assert np.mean([len(ids) for ids in r["tp_ids"]]) > 40  # the rows did generate
    assert r["fsdp_gathers"]["count"] > 0  # the training layout gathers weights per token
    assert r["tp_gathers"] == {"count": 0, "bytes": 0}

"""GRPO advantages, the PPO-clip + KL loss, and their micro-batch / device invariance."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from configs.base import VARIANTS, base_config
from seal_jax import optim, rl, train_step
from tests import rl_fixtures as fx
from tests.devices import run_with_devices

AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def reference_advantages(rewards, group_ids, eps=1e-6, std_normalize=True):
    out = np.zeros(len(rewards))
    for g in np.unique(group_ids):
        idx = np.flatnonzero(group_ids == g)
        r = rewards[idx].astype(np.float64)
        if len(r) == 1 or np.all(r == r[0]):
            continue
        centered = r - r.mean()
        out[idx] = centered / (r.std(ddof=1) + eps) if std_normalize else centered
    return out


@pytest.mark.parametrize("std_normalize", [True, False])
def test_grpo_advantages_match_reference(std_normalize):
    rng = np.random.default_rng(0)
    group_ids = np.array([7, 7, 7, 7, 3, 3, 3, 3, 9, 5, 5, 5, 7, 2, 2, 2])  # unsorted, a singleton
    rewards = rng.uniform(size=16).astype(np.float32)
    rewards[13:] = 0.1  # all equal, and their float32 mean is not exactly 0.1
    got = np.asarray(rl.grpo_advantages(rewards, group_ids, std_normalize=std_normalize))
    expected = reference_advantages(rewards, group_ids, std_normalize=std_normalize)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.all(got[[8, 13, 14, 15]] == 0.0)


def test_all_equal_groups_get_exactly_zero_despite_rounding():
    rewards = np.repeat(np.float32([0.7, 0.3, 0.1]), 8)  # float32 group means are off by an ulp
    advantages = rl.grpo_advantages(rewards, np.repeat(np.arange(3), 8))
    assert np.all(np.asarray(advantages) == 0.0)


def test_zero_advantage_group_fraction():
    rewards = np.array([1, 1, 0, 0, 1, 0, 1, 1, 1], np.float32)
    group_ids = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4])  # groups 0, 1, 3 and the singleton 4
    assert float(rl.zero_advantage_group_fraction(rewards, group_ids)) == pytest.approx(4 / 5)


def reference_loss(batch, logprobs, entropy, cfg):
    """verl's PPO loss with dual-clip, KL and entropy terms, written out with numpy."""
    lp, old, ref = (
        np.asarray(x, np.float64) for x in (logprobs, batch["old_logprobs"], batch["ref_logprobs"])
    )
    m = batch["loss_mask"].astype(np.float64)
    adv = np.broadcast_to(batch["advantages"][:, None], m.shape)
    ratio = np.exp(np.clip(lp - old, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    pg = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high))
    pg = np.where(adv < 0, np.minimum(pg, -adv * cfg.dual_clip), pg)
    kl = {
        "k1": lp - ref,
        "k2": 0.5 * (lp - ref) ** 2,
        "k3": np.clip(np.exp(ref - lp) - (ref - lp) - 1, -10, 10),
    }[cfg.kl_estimator]
    per_token = pg + cfg.kl_coef * kl - cfg.entropy_coef * np.asarray(entropy, np.float64)
    rows = m.any(axis=1)
    if cfg.loss_agg == "token-mean":
        loss = (per_token * m).sum() / m.sum()
    elif cfg.loss_agg == "seq-mean-token-mean":
        loss = ((per_token * m).sum(1)[rows] / m.sum(1)[rows]).mean()
    else:
        loss = ((per_token * m).sum(1)[rows] / cfg.loss_token_norm).mean()
    valid = m.astype(bool)
    clipped = ((adv > 0) & (ratio > 1 + cfg.clip_high)) | ((adv < 0) & (ratio < 1 - cfg.clip_low))
    metrics = {
        "clip_fraction": clipped[valid].mean(),
        "ratio_min": ratio[valid].min(),
        "ratio_max": ratio[valid].max(),
        "advantage_abs_mean": np.abs(adv)[valid].mean(),
        "ref_kl": kl[valid].mean(),
    }
    return loss, metrics


@pytest.mark.parametrize("loss_agg", AGGS)
@pytest.mark.parametrize("kl_estimator", ["k1", "k2", "k3"])
def test_policy_loss_matches_reference(loss_agg, kl_estimator):
    cfg = fx.rl_config(
        loss_agg=loss_agg, kl_estimator=kl_estimator, dual_clip=1.5, loss_token_norm=10.0
    )
    batch = fx.training_batch(seed=1)
    params = fx.init_params()
    logprobs, entropy = fx.logprob_entropy_fn(
        params, batch["input_ids"], batch["positions"], batch["mask"], batch["targets"]
    )
    loss, metrics = rl.make_loss_fn(fx.logprob_entropy_fn, cfg)(params, batch)
    expected_loss, expected_metrics = reference_loss(batch, logprobs, entropy, cfg)
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5)
    for name, value in expected_metrics.items():
        assert float(metrics[name]) == pytest.approx(value, rel=1e-5, abs=1e-7), name


def test_dual_clip_caps_negative_advantage_loss():
    logprobs = jnp.log(jnp.array([[5.0], [5.0], [0.5]]))  # ratios 5, 5, 0.5 against old 0
    old = jnp.zeros((3, 1))
    mask = jnp.ones((3, 1), bool)
    advantages = jnp.array([-1.0, 1.0, -1.0])
    options = dict(kl_coef=0.0, dual_clip=3.0, loss_agg="token-mean")
    loss, metrics = rl.policy_loss(logprobs, old, advantages, mask, **options)
    per_token = [3.0, -1.2, 0.8]  # capped at |A| * 3; clipped at 1 + 0.2; clipped at 1 - 0.2
    assert float(loss) == pytest.approx(np.mean(per_token), rel=1e-6)
    assert float(metrics["dual_clip_fraction"]) == pytest.approx(1 / 3)


def test_unit_weights_reproduce_plain_grpo_exactly():
    raw = fx.make_batch(seed=2)
    advantages = rl.grpo_advantages(raw["rewards"], raw["group_ids"])
    weighted = rl.weighted_advantages(advantages, np.ones_like(raw["weights"]))
    np.testing.assert_array_equal(np.asarray(weighted), np.asarray(advantages))
    scaled = rl.weighted_advantages(advantages, raw["weights"])
    assert np.all(np.sign(np.asarray(scaled)) == np.sign(np.asarray(advantages)))


def test_all_equal_groups_give_zero_policy_gradient():
    batch = fx.training_batch(seed=3)
    raw = fx.make_batch(seed=3)
    batch["advantages"] = np.asarray(
        rl.grpo_advantages(np.repeat([0.0, 1.0], 8).astype(np.float32), raw["group_ids"])
    )
    assert np.all(batch["advantages"] == 0.0)
    loss_fn = rl.make_loss_fn(fx.logprob_fn, fx.rl_config(kl_coef=0.0, entropy_coef=0.0))
    grads = jax.grad(lambda p: loss_fn(p, batch)[0])(fx.init_params())
    assert all(np.all(np.asarray(g) == 0.0) for g in jax.tree.leaves(grads))


def test_bad_input_raises():
    x = jnp.zeros((2, 3))
    mask = jnp.ones((2, 3), bool)
    with pytest.raises(ValueError, match="loss_agg"):
        rl.policy_loss(x, x, x, mask, kl_coef=0.0, loss_agg="sum")
    with pytest.raises(ValueError, match="kl_estimator"):
        rl.policy_loss(x, x, x, mask, ref_logprobs=x, kl_estimator="k4")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        rl.policy_loss(x, jnp.zeros((2, 4)), x, mask, kl_coef=0.0)
    with pytest.raises(ValueError, match="advantages"):
        rl.policy_loss(x, x, jnp.zeros(3), mask, kl_coef=0.0)
    with pytest.raises(ValueError, match="advantages"):  # per-trajectory only, never per token
        rl.policy_loss(x, x, x, mask, kl_coef=0.0)
    with pytest.raises(ValueError, match="dual_clip"):
        rl.policy_loss(x, x, x, mask, kl_coef=0.0, dual_clip=0.5)
    with pytest.raises(ValueError, match="ref_logprobs"):
        rl.policy_loss(x, x, x, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="group_ids"):
        rl.grpo_advantages(jnp.zeros(4), jnp.zeros(3))
    with pytest.raises(ValueError, match="micro-batches"):
        train_step.split_micro_batches(fx.training_batch(), 3, "token-mean")


def summed_loss_and_grads(loss_fn, params, batches):
    value_and_grad = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b)[0]))
    results = [value_and_grad(params, b) for b in batches]
    loss = sum(float(r[0]) for r in results)
    grads = jax.tree.map(
        lambda *g: sum(np.asarray(x, np.float64) for x in g), *[r[1] for r in results]
    )
    return loss, grads


@pytest.mark.parametrize("loss_agg", AGGS)
def test_micro_batches_sum_to_the_full_batch(loss_agg):
    loss_fn = rl.make_loss_fn(fx.logprob_entropy_fn, fx.rl_config(loss_agg=loss_agg))
    params, batch = fx.init_params(), fx.training_batch(seed=4)
    full_loss, full_grads = summed_loss_and_grads(loss_fn, params, [batch])
    for k in (1, 2, 4, 8, 16):  # every split of the 16 rows, down to one row per micro-batch
        loss, grads = summed_loss_and_grads(
            loss_fn, params, train_step.split_micro_batches(batch, k, loss_agg)
        )
        assert loss == pytest.approx(full_loss, rel=1e-5)
        for g, full in zip(jax.tree.leaves(grads), jax.tree.leaves(full_grads)):
            np.testing.assert_allclose(g, full, rtol=1e-4, atol=1e-6)


def release_loss(params, batch, cfg, devices):
    """The SEAL release's actor loss written out (exp/SEAL.yaml, het_actor.update_policy): each
    of `devices` GPUs runs micro-batches of one trajectory (ppo_micro_batch_size_per_gpu 1),
    takes verl's token-mean ("token-mean" in its config) inside each and divides it by its
    accumulation steps; FSDP averages the devices' gradients."""
    args = (batch["input_ids"], batch["positions"], batch["mask"], batch["targets"])
    logprobs, entropy = fx.logprob_entropy_fn(params, *args)
    old, ref, m = batch["old_logprobs"], batch["ref_logprobs"], batch["loss_mask"]
    adv = batch["advantages"][:, None]
    ratio = jnp.exp(logprobs - old)
    pg = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high))
    pg = jnp.where(adv < 0, jnp.minimum(pg, -adv * cfg.dual_clip), pg)
    kl = jnp.clip(jnp.exp(ref - logprobs) - (ref - logprobs) - 1, -10, 10)  # low_var_kl
    per_token = pg + cfg.kl_coef * kl - cfg.entropy_coef * entropy
    trajectory_means = jnp.where(m, per_token, 0.0).sum(1) / m.sum(1)
    accum = len(m) // devices
    return jnp.mean(trajectory_means.reshape(devices, accum).sum(1) / accum)


@pytest.mark.parametrize("devices", [1, 4])  # the paper ran 4 GPUs
def test_seq_mean_token_mean_is_the_releases_one_trajectory_micro_batches(devices):
    cfg = fx.rl_config(loss_agg="seq-mean-token-mean", dual_clip=1.5)
    params, batch = fx.init_params(), fx.training_batch(seed=9)
    batch["loss_mask"][-1, 0] = True  # a release trajectory always has a loss token
    want_loss, want = jax.value_and_grad(release_loss)(params, batch, cfg, devices)
    loss_fn = rl.make_loss_fn(fx.logprob_entropy_fn, cfg)
    got_loss, got = jax.value_and_grad(lambda p: loss_fn(p, batch)[0])(params)
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-5)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)
    # What the release's config names, token-mean over the batch, is another loss here.
    cfg.loss_agg = "token-mean"
    token_mean = jax.grad(lambda p: rl.make_loss_fn(fx.logprob_entropy_fn, cfg)(p, batch)[0])
    assert not np.allclose(np.asarray(token_mean(params)["out"]), np.asarray(want["out"]))


def test_paper_preset_aggregates_by_trajectory_and_the_cpu_defaults_by_token():
    from configs import qwen, tiny

    assert {qwen.get_config(v).rl.loss_agg for v in VARIANTS} == {"seq-mean-token-mean"}
    assert base_config().rl.loss_agg == tiny.get_config().rl.loss_agg == "token-mean"


def test_micro_batches_keep_each_shared_prompt_with_its_rows():
    batch = fx.training_batch(seed=4)  # 16 rows, groups of 4
    rows = len(batch["loss_mask"])
    prompts = np.arange(rows // 4 * 3).reshape(rows // 4, 3)
    batch.update(prompt_ids=prompts, prompt_positions=prompts, prompt_mask=prompts > 0)
    parts = train_step.split_micro_batches(batch, 2, "token-mean")
    for i, part in enumerate(parts):
        np.testing.assert_array_equal(part["input_ids"], batch["input_ids"][i * 8 : (i + 1) * 8])
        np.testing.assert_array_equal(part["prompt_ids"], prompts[i * 2 : (i + 1) * 2])
    with pytest.raises(ValueError, match="4 prompts"):
        train_step.split_micro_batches(batch, 8, "token-mean")  # 8 divides the rows, not groups


def one_device_step(loss_fn, optimizer, params=None):
    """(params, optimizer state, jitted train step) on a one-device mesh."""
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    replicated = NamedSharding(mesh, PartitionSpec())
    params = fx.init_params() if params is None else params
    param_shardings = jax.tree.map(lambda _: replicated, params)
    state_shardings = optim.opt_state_shardings(optimizer, params, param_shardings)
    step = train_step.make_train_step(
        loss_fn,
        optimizer,
        param_shardings,
        NamedSharding(mesh, PartitionSpec("data")),
        state_shardings,
    )
    init = jax.jit(optimizer.init, out_shardings=state_shardings)
    return params, init(params), step


@pytest.mark.parametrize("grad_accum", [2, 4])
def test_gradient_accumulation_matches_one_large_step(grad_accum):
    cfg = fx.rl_config(loss_agg="seq-mean-token-mean")
    loss_fn = rl.make_loss_fn(fx.logprob_entropy_fn, cfg)
    batch = fx.training_batch(seed=5)
    params, state, step = one_device_step(loss_fn, optim.make_optimizer(fx.optim_config()))
    expected, _, full_metrics = step(params, state, batch)
    accum_opt = optim.make_optimizer(fx.optim_config(grad_accum=grad_accum))
    params, state, step = one_device_step(loss_fn, accum_opt)
    losses = []
    for i, micro in enumerate(train_step.split_micro_batches(batch, grad_accum, cfg.loss_agg)):
        before = jax.tree.map(np.array, params)
        params, state, metrics = step(params, state, micro)
        losses.append(float(metrics["loss"]))
        if i < grad_accum - 1:  # nothing moves until the last micro-batch
            jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, params))
    assert sum(losses) == pytest.approx(float(full_metrics["loss"]), rel=1e-5)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def sequence_logprobs(params, batch):
    lp = fx.logprob_fn(
        params, batch["input_ids"], batch["positions"], batch["mask"], batch["targets"]
    )
    return np.asarray(jnp.sum(jnp.where(batch["loss_mask"], lp, 0.0), axis=1))


def test_one_step_moves_logprobs_with_the_advantage_sign():
    batch = fx.training_batch(seed=6, rows=3, group_size=3)  # the last row has no model token
    batch["advantages"] = np.array([1.0, -1.0, 0.0], np.float32)
    params = fx.init_params()
    current = fx.logprob_fn(
        params, batch["input_ids"], batch["positions"], batch["mask"], batch["targets"]
    )
    batch["old_logprobs"] = batch["ref_logprobs"] = np.asarray(current)
    loss_fn = rl.make_loss_fn(fx.logprob_fn, fx.rl_config(entropy_coef=0.0))
    before = sequence_logprobs(params, batch)
    params, state, step = one_device_step(loss_fn, optim.make_optimizer(fx.optim_config(lr=1e-3)))
    params, _, _ = step(params, state, batch)
    after = sequence_logprobs(params, batch)
    assert after[0] > before[0] and after[1] < before[1]


MULTI_DEVICE_CHECK = """
import json, jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from seal_jax import optim, rl, train_step
from tests import rl_fixtures as fx

def run(mesh, param_spec):
    cfg = fx.rl_config(loss_agg=LOSS_AGG)
    loss_fn = rl.make_loss_fn(fx.logprob_entropy_fn, cfg)
    optimizer = optim.make_optimizer(fx.optim_config(grad_accum=ACCUM))
    params = fx.init_params()
    param_shardings = {"embed": NamedSharding(mesh, param_spec), "out": NamedSharding(mesh, P())}
    state_shardings = optim.opt_state_shardings(optimizer, params, param_shardings)
    batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))
    step = train_step.make_train_step(loss_fn, optimizer, param_shardings, batch_sharding,
                                      state_shardings)
    params = jax.device_put(params, param_shardings)
    state = jax.jit(optimizer.init, out_shardings=state_shardings)(params)
    grads = jax.jit(jax.grad(lambda p, b: loss_fn(p, b)[0]),
                    in_shardings=(param_shardings, batch_sharding))
    batch = fx.training_batch(seed=7, rows=ROWS)
    out = {"grads": [], "loss": 0.0}
    for micro in train_step.split_micro_batches(batch, ACCUM, cfg.loss_agg):
        out["grads"].append(jax.tree.map(lambda g: np.asarray(g).tolist(), grads(params, micro)))
        params, state, metrics = step(params, state, micro)
        out["loss"] += float(metrics["loss"])
    out["params"] = jax.tree.map(lambda x: np.asarray(x).tolist(), params)
    out["embed_shard_shape"] = params["embed"].addressable_shards[0].data.shape
    return out

auto = (jax.sharding.AxisType.Auto,) * 2
many = jax.make_mesh((DATA, FSDP), ("data", "fsdp"), axis_types=auto)
one = jax.make_mesh((1, 1), ("data", "fsdp"), devices=jax.devices()[:1], axis_types=auto)
print(json.dumps({"many": run(many, P(None, "fsdp")), "one": run(one, P())}))
"""


@pytest.mark.parametrize(
    ("loss_agg", "data", "fsdp", "rows", "accum"),
    [
        ("token-mean", 4, 2, 32, 2),
        ("seq-mean-token-mean", 4, 2, 32, 2),
        # The release's layout: 4 devices, one trajectory per device in each micro-batch.
        ("seq-mean-token-mean", 4, 1, 16, 4),
    ],
)
def test_devices_match_one_device(loss_agg, data, fsdp, rows, accum):
    code = MULTI_DEVICE_CHECK.replace("LOSS_AGG", repr(loss_agg))
    for name, value in (("DATA", data), ("FSDP", fsdp), ("ROWS", rows), ("ACCUM", accum)):
        code = code.replace(name, str(value))
    result = json.loads(run_with_devices(code, num_devices=data * fsdp).strip().splitlines()[-1])
    many, one = result["many"], result["one"]
    assert many["embed_shard_shape"] == [fx.VOCAB, fx.DIM // fsdp]
    assert many["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6)  # terms of size ~1
    for key in ("grads", "params"):
        got, want = np.array(jax.tree.leaves(many[key])), np.array(jax.tree.leaves(one[key]))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_one_step_on_tiny_qwen_moves_logprobs_with_the_advantage_sign():
    from seal_jax import models

    cfg = models.QwenConfig(
        model_type="qwen3",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        qkv_bias=False,
        qk_norm=True,
        tie_word_embeddings=True,
        max_position_embeddings=64,
    )

    def logprob_fn(params, input_ids, positions, mask, targets):
        return models.token_logprobs(params, cfg, input_ids, positions, mask, targets, chunk=8)

    rng = np.random.default_rng(8)
    ids = rng.integers(0, cfg.vocab_size, size=(2, 13)).astype(np.int32)
    positions = np.broadcast_to(np.arange(12, dtype=np.int32), (2, 12))
    mask = np.ones((2, 12), bool)
    batch = {
        "input_ids": ids[:, :-1],
        "positions": positions,
        "mask": mask,
        "targets": ids[:, 1:],
        "loss_mask": mask & (np.arange(12) >= 3),  # a 3-token prompt, then sampled tokens
        "advantages": np.array([1.0, -1.0], np.float32),
    }
    params = models.init_params(cfg, jax.random.key(0))
    current = np.asarray(logprob_fn(params, ids[:, :-1], positions, mask, ids[:, 1:])[0])
    batch["old_logprobs"] = batch["ref_logprobs"] = current
    loss_fn = rl.make_loss_fn(logprob_fn, fx.rl_config(entropy_coef=0.0))

    def sequence_logprob(p):
        lp = logprob_fn(p, ids[:, :-1], positions, mask, ids[:, 1:])[0]
        return np.asarray(jnp.sum(jnp.where(batch["loss_mask"], lp, 0.0), axis=1))

    before = sequence_logprob(params)
    optimizer = optim.make_optimizer(fx.optim_config(lr=1e-3))
    params, state, step = one_device_step(loss_fn, optimizer, params)
    params, _, _ = step(params, state, batch)
    after = sequence_logprob(params)
    assert after[0] > before[0] and after[1] < before[1]

"""`run.py --mode=compile` on 8 simulated CPU devices: every program of a step compiles from the
model's config.json alone, compile.json reports it, and a config that cannot fit exits 2 with
one line naming the program and what to change. (TPU topologies: benchmarks/compile_targets.py.)"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from configs import qwen, qwen35
from seal_jax import config as config_lib
from seal_jax import estimate, sharding
from seal_jax.models import Qwen35Config, QwenConfig
from seal_jax.models.checkpoint import param_shapes
from seal_jax.models.config import architecture_from_dir
from tests import hf_models
from tests.devices import REPO, TEST_XLA_FLAGS, cpu_env

ARGS = [
    "--config=configs/tiny.py",
    "--mode=compile",
    "--config.mesh.data=1",
    "--config.mesh.fsdp=-1",
    "--config.compilation_cache_dir=",
]


def _compile(workdir, *extra):
    """Starts `run.py --mode=compile`; its stdout and stderr go to files beside workdir."""
    env = cpu_env(8, TEST_XLA_FLAGS)
    cmd = [sys.executable, "run.py", *ARGS, f"--workdir={workdir}", *extra]
    with open(f"{workdir}.out", "w") as out, open(f"{workdir}.err", "w") as err:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err, text=True)


def _finished(proc, workdir):
    """The finished process, with its output as `stdout` and `stderr` (as subprocess.run)."""
    proc.wait(timeout=600)
    proc.stdout, proc.stderr = (Path(f"{workdir}.{k}").read_text() for k in ("out", "err"))
    return proc


def test_compile_mode_reports_every_program_and_refuses_what_cannot_fit(tmp_path):
    # Both runs at once: each compiles on one core.
    fits = _compile(tmp_path / "fits", "--config.rollout.slots=16")  # continuous batching
    # 64 rollout rows of a 262k-token context: a KV cache far beyond a CPU device's share.
    big = ["--config.rollout.context_limit=262144", "--config.train.batch_tasks=8"]
    too_big = _compile(tmp_path / "big", *big)
    proc, too_big = _finished(fits, tmp_path / "fits"), _finished(too_big, tmp_path / "big")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "fits" / "compile.json").read_text())
    names = [p["name"] for p in report["programs"]]
    rollout = ["rollout_prefill", "rollout_decode", "rollout_prefill_rows"]
    rollout += ["rollout_decode_rows", "rollout_copy_rows"]
    assert names == ["update_micro_step", "logprob_pass", *rollout]
    assert report["fits"] and report["chips"] == 8 and report["hbm_bytes_per_chip"] > 0
    for program in report["programs"]:
        assert 0 < program["peak_bytes_per_chip"] <= report["hbm_bytes_per_chip"], program
        assert program["peak_bytes_per_chip"] >= program["argument_bytes"] + program["temp_bytes"]
    assert not (tmp_path / "fits" / "warm_start").exists()  # no weights trained or loaded
    assert "update_micro_step" in proc.stdout and "peak" in proc.stdout

    proc = too_big
    assert proc.returncode == 2, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "needs" in error[0] and "per chip" in error[0], proc.stderr[-2000:]
    assert "rollout.context_limit" in error[0] and "Traceback" not in proc.stderr
    assert not json.loads((tmp_path / "big" / "compile.json").read_text())["fits"]


def test_hardware_targets_keep_the_paper_setting_and_combine_with_variants():
    for module in (qwen, qwen35):
        for target in module.TARGETS:
            c = module.get_config(target)
            config_lib.validate(c)
            paper = (c.train.batch_tasks, c.rl.group_size, c.train.mini_batch_tasks, c.optim.lr)
            assert paper == (32, 8, 8, 1e-6), target
            assert (c.rollout.context_limit, c.rollout.max_new_tokens) == (16384, 4096)
            assert c.model.param_dtype == "float32" and c.aot.topology
    c = qwen.get_config("vanilla_grpo,7b-v5p-8")
    assert (c.aot.topology, c.optim.grad_accum, c.weighting.enabled) == ("v5p:2x2x1", 16, False)
    assert qwen.get_config("7b-v5p-8").weighting.enabled and not qwen.get_config().aot.topology
    for bad in ("seal,vanilla_grpo", "v9-8", "7b-v5p-8,3b-v5e-8"):
        with pytest.raises(ValueError, match="at most one variant"):
            qwen.get_config(bad)
    c = qwen35.get_config("vanilla_grpo,4b-v5p-8")
    assert (c.aot.topology, c.optim.grad_accum, c.weighting.enabled) == ("v5p:2x2x1", 16, False)
    for bad in ("seal,vanilla_grpo", "7b-v5p-8", "4b-v5p-8,4b-v5p-8"):
        with pytest.raises(ValueError, match="configs/qwen35.py.*at most one variant"):
            qwen35.get_config(bad)


def test_step_estimate_counts_every_weight_matrix_and_scales_with_chips():
    cfg = QwenConfig.from_dir(os.path.join(REPO, "benchmarks", "model_configs", "qwen2.5-7b"))
    leaves = jax.tree_util.tree_flatten_with_path(param_shapes(cfg))[0]
    matrices = sum(
        math.prod(x.shape) for path, x in leaves if path[-1].key in ("kernel", "lm_head")
    )
    assert estimate.matmul_parameters(cfg) == matrices  # q/k/v/o, MLP, output matrix
    c = qwen.get_config("7b-v5p-8")
    four, eight = (estimate.step_estimate(c, cfg, "TPU v5", n) for n in (4, 8))
    tokens, length = 32 * 8 * 16384, 16384
    attention = 2 * 28 * 28 * 128 * tokens * length  # causal: half the keys, scores and values
    # update with remat (4 forward passes), old and reference log-probs (1 each)
    assert four["update_flops_per_step"] == 6 * (2 * matrices * tokens + attention)
    assert eight["update_s_per_step"] == pytest.approx(four["update_s_per_step"] / 2)
    # decoding in sampler groups of 4 chips (the target's): each chip reads a quarter of the
    # bf16 weights and of its group's cache (16 rows of a chunk over the groups; 28 layers x 4
    # KV heads x 128 x k, v x 2 bytes per token, half the context on average)
    cache = 28 * 4 * 128 * 2 * 2 * length / 2
    for result, group_rows in ((four, 16), (eight, 8)):
        decode = result["decode"]
        want = (2 * matrices + group_rows * cache) / 4
        assert decode["bytes_per_chip_per_step"] == pytest.approx(want)
        assert decode["tokens_per_s_per_chip"] == pytest.approx(group_rows / 4 / (want / 2.76e12))
    assert eight["paper_run_hours"] < four["paper_run_hours"]
    assert estimate.step_estimate(c, cfg, "cpu", 8) == {}


def test_qwen35_estimate_counts_every_weight_and_only_the_full_layers_caches():
    """Qwen3.5: the weights multiplied per token are the Hugging Face model's matrices (q_proj
    twice as wide, in_proj_qkv/z/b/a, out_proj, the MLP, lm_head) and its depthwise conv1d; the
    attention FLOPs and the KV cache are the full layers' alone, the linear layers' delta rule and
    states do not grow with the context, and a sampler group reads their weights whole."""
    import transformers

    text = hf_models.tiny_qwen35_config("qwen35_mixed")  # untied: lm_head is a matrix of its own
    torch_model = transformers.Qwen3_5ForCausalLM(text)
    weights = sum(
        p.numel()
        for name, p in torch_model.named_parameters()
        if p.ndim >= 2 and "embed_tokens" not in name  # the input embedding is a lookup
    )
    assert estimate.matmul_parameters(Qwen35Config.from_hf_dict(text.to_dict())) == weights

    cfg = architecture_from_dir(os.path.join(REPO, "benchmarks", "model_configs", "qwen3.5-4b"))
    leaves = [
        (sharding.path_str(path), math.prod(x.shape))
        for path, x in jax.tree_util.tree_flatten_with_path(param_shapes(cfg))[0]
    ]
    # Tied: the output matrix is the embedding; every other matrix is a kernel or the conv1d.
    multiplied = ("kernel", "conv1d/weight", "embed_tokens/embedding")
    matrices = sum(n for path, n in leaves if path.endswith(multiplied))
    linear = sum(n for path, n in leaves if "linear_attn" in path and path.endswith(multiplied))
    assert estimate.matmul_parameters(cfg) == matrices
    assert estimate.linear_parameters(cfg) == linear
    c = qwen35.get_config("4b-v5p-8")
    four, eight = (estimate.step_estimate(c, cfg, "TPU v5", n) for n in (4, 8))
    tokens, length = 32 * 8 * 16384, 16384
    attention = 2 * 8 * 16 * 256 * tokens * length  # the 8 full layers, causal
    delta_rule = 24 * 32 * (64 * (5 * 128 + 3 * 128) + 6 * 128 * 128) * tokens
    assert four["update_flops_per_step"] == 6 * (2 * matrices * tokens + attention + delta_rule)
    assert eight["update_s_per_step"] == pytest.approx(four["update_s_per_step"] / 2)
    # The cache of a row: the 8 full layers' k and v grow with the context; the 24 linear
    # layers' float32 states (32 x 128 x 128) and convolution inputs (3 x 8192, bf16) do not.
    for slots in (4096, 16384):
        row = estimate.cache_bytes_per_row(cfg, slots)
        assert row["kv"] == 8 * 2 * 4 * 256 * 2 * slots
        assert (row["state"], row["conv"]) == (24 * 32 * 128 * 128 * 4, 24 * 3 * 8192 * 2)
    # Decoding in groups of 4 chips (16 rows of a chunk over the groups): each chip reads a
    # quarter of the other bf16 weights and of its rows' KV cache (half the context on average),
    # the linear layers' weights whole, and reads and writes its rows' linear states whole.
    states = 2 * (24 * 32 * 128 * 128 * 4 + 24 * 3 * 8192 * 2)
    cache = 8 * 2 * 4 * 256 * 2 * length / 2
    for result, group_rows in ((four, 16), (eight, 8)):
        decode = result["decode"]
        want = 2 * (matrices - linear) / 4 + 2 * linear + group_rows * (cache / 4 + states)
        assert decode["bytes_per_chip_per_step"] == pytest.approx(want)
        assert decode["tokens_per_s_per_chip"] == pytest.approx(group_rows / 4 / (want / 2.76e12))


def test_training_on_an_accelerator_stops_before_any_weight_when_a_program_cannot_fit(
    tmp_path, monkeypatch
):
    from configs import tiny
    from seal_jax import aot, modes

    config = tiny.get_config()
    config.compilation_cache_dir = ""
    config.rollout.context_limit = 256  # the programs compile faster; none fits 1 MiB either way
    assert not modes._check_before_train(config)  # on this CPU host: no check
    monkeypatch.setattr(modes.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(aot, "hbm_bytes", lambda device: 2**20)  # a 1 MiB accelerator
    with pytest.raises(aot.DoesNotFit, match="needs .* GiB per chip"):
        modes.run("train", config, str(tmp_path))
    assert json.loads((tmp_path / "compile.json").read_text())["fits"] is False
    assert not (tmp_path / "warm_start").exists() and not (tmp_path / "checkpoints").exists()

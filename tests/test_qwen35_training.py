"""Qwen3.5 training: shared-prompt passes against whole-sequence rows (log-probs and gradients,
float32 and bfloat16 compute), and run.py end to end (eval, two training steps, export) on a tiny
random Qwen3.5 checkpoint with the suite's tokenizer."""

import dataclasses
import functools
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seal_jax.metrics import read_jsonl
from seal_jax.models import load_hf_checkpoint, token_logprobs
from tests import hf_models
from tests.devices import REPO, cpu_env, in_background, selected
from tests.test_trainer import SUITE_ARGS, _assert_export_is_checkpoint

# Two groups of three rows; the prompts (less their last id, which starts every row) are 8 and 4
# ids, the rows' continuations 2 to 12 ids. Linear attention in chunks of 4: the prompt pass and
# the rows each span several chunks, and the prompt's end falls inside a chunk of the whole rows.
PROMPT_LENGTHS, ROWS_PER_PROMPT, PROMPT_WIDTH, WIDTH, LINEAR_CHUNK = (9, 5), 3, 12, 24, 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tiny mixed-layer Qwen3.5 (linear, full, linear, full), linear chunks of 4."""
    path = str(tmp_path_factory.mktemp("qwen35_mixed"))
    hf_models.build_tiny_qwen35(path, "qwen35_mixed", seed=3)
    loaded = load_hf_checkpoint(path)
    cfg = dataclasses.replace(loaded.config, linear_chunk=LINEAR_CHUNK)
    return dataclasses.replace(loaded, config=cfg)


def _batch(vocab, prompt_padding):
    """Whole right-padded rows [B, WIDTH] with their loss mask, and the same rows as shared
    prompts [G, PROMPT_WIDTH] (padded on the `prompt_padding` side) plus continuations [B, T]
    with the loss mask aligned to the same target tokens (as `trajectories.training_batch`)."""
    rng = np.random.default_rng(0)
    b, g = len(PROMPT_LENGTHS) * ROWS_PER_PROMPT, len(PROMPT_LENGTHS)
    whole = {k: np.zeros((b, WIDTH), np.int32) for k in ("ids", "targets")}
    whole["loss"] = np.zeros((b, WIDTH), np.float32)
    whole["mask"] = np.zeros((b, WIDTH), bool)
    whole["positions"] = np.broadcast_to(np.arange(WIDTH, dtype=np.int32), (b, WIDTH))
    t = WIDTH - min(PROMPT_LENGTHS) + 1
    rest = {k: np.zeros((b, t), np.int32) for k in ("ids", "targets", "positions")}
    rest["loss"], rest["mask"] = np.zeros((b, t), np.float32), np.zeros((b, t), bool)
    prompt = {k: np.zeros((g, PROMPT_WIDTH), np.int32) for k in ("ids", "positions")}
    prompt["mask"] = np.zeros((g, PROMPT_WIDTH), bool)
    for group, p_len in enumerate(PROMPT_LENGTHS):
        shared = rng.integers(1, vocab, p_len)
        at = (
            slice(0, p_len - 1)
            if prompt_padding == "right"
            else slice(PROMPT_WIDTH - p_len + 1, None)
        )
        prompt["ids"][group, at], prompt["mask"][group, at] = shared[:-1], True
        prompt["positions"][group, at] = np.arange(p_len - 1)
        for r in range(ROWS_PER_PROMPT):
            row = group * ROWS_PER_PROMPT + r
            seq = np.concatenate([shared, rng.integers(1, vocab, rng.integers(3, WIDTH - p_len))])
            n = len(seq)
            whole["ids"][row, :n], whole["mask"][row, :n] = seq, True
            whole["targets"][row, : n - 1] = seq[1:]
            whole["loss"][row, p_len - 1 : n - 1] = 1.0  # every target after the prompt
            tail = seq[p_len - 1 :]
            rest["ids"][row, : len(tail)], rest["mask"][row, : len(tail)] = tail, True
            rest["targets"][row, : len(tail) - 1] = tail[1:]
            rest["loss"][row, : len(tail) - 1] = 1.0
            rest["positions"][row] = p_len - 1 + np.arange(t)
    return whole, prompt, rest


@functools.partial(jax.jit, static_argnames=("cfg", "dtype"))
def _loss_and_grads(params, rows, prompt, weights, cfg, dtype):
    """token_logprobs of the rows (continuing `prompt` unless None) and the gradient of their
    loss-masked sum weighted per row."""

    def loss(params):
        shared = None if prompt is None else (prompt["ids"], prompt["positions"], prompt["mask"])
        logp, _ = token_logprobs(
            params,
            cfg,
            rows["ids"],
            rows["positions"],
            rows["mask"],
            rows["targets"],
            dtype=dtype,
            chunk=8,
            prompt=shared,
        )
        return jnp.sum(logp * rows["loss"] * weights), logp

    return jax.value_and_grad(loss, has_aux=True)(params)


def _passes(model, prompt_padding, dtype):
    """{"whole": ..., "shared": ...}: (log-probs on the loss tokens, in the same order, and the
    gradients) of the whole rows and of the rows on their shared prompts."""
    whole, prompt, rest = _batch(model.config.vocab_size, prompt_padding)
    weights = np.random.default_rng(1).normal(size=(len(whole["ids"]), 1)).astype(np.float32)
    out = {}
    for name, rows, shared in (("whole", whole, None), ("shared", rest, prompt)):
        (_, logp), grads = _loss_and_grads(model.params, rows, shared, weights, model.config, dtype)
        out[name] = (np.asarray(logp)[rows["loss"] > 0], jax.tree.leaves(grads))
    return out


def _differences(a, b):
    """(largest absolute log-prob difference, largest gradient difference relative to the
    largest gradient entry of its parameter) between two `_passes` results."""
    logp_diff = float(np.abs(a[0] - b[0]).max())
    grad_rel = max(
        float(np.abs(np.asarray(x, np.float64) - y).max() / np.abs(y).max())
        for x, y in zip(a[1], b[1])
    )
    return logp_diff, grad_rel


@pytest.mark.parametrize("prompt_padding", ["right", "left"])
def test_shared_prompt_float32_matches_whole_rows(model, prompt_padding):
    """float32: log-probs within 1e-5 and every parameter's gradient within 2e-5 of its largest
    entry (the sums run in another order; measured 2e-6 and 6e-6). Rows that lose the prompt's
    recurrent states, convolution inputs or keys and values are off by 1 or more in both."""
    passes = _passes(model, prompt_padding, jnp.float32)
    logp_diff, grad_rel = _differences(passes["shared"], passes["whole"])
    assert logp_diff <= 1e-5 and grad_rel <= 2e-5, (logp_diff, grad_rel)


def test_shared_prompt_bfloat16_close_to_whole_rows(model):
    """bfloat16 compute (float32 parameters, as training): the two passes round differently (the
    prompt's keys in an attention block of their own, the delta rule's chunks split elsewhere).
    Log-probs within 0.05 and gradients within 10% of each parameter's largest entry of each
    other (measured 0.017 and 5%), and the shared pass at most twice as far from the float32
    result as the whole rows' bfloat16 pass (measured 1.0 and 1.4 times)."""
    bf16 = _passes(model, "right", jnp.bfloat16)
    reference = _passes(model, "right", jnp.float32)["whole"]
    logp_diff, grad_rel = _differences(bf16["shared"], bf16["whole"])
    assert logp_diff <= 0.05 and grad_rel <= 0.1, (logp_diff, grad_rel)
    shared_error = _differences(bf16["shared"], reference)
    whole_error = _differences(bf16["whole"], reference)
    assert all(s <= 2 * w for s, w in zip(shared_error, whole_error)), (shared_error, whole_error)


# run.py on the suite with a tiny Qwen3.5: test_trainer.py's arguments without its adaptive
# interface and cause utilities (each step's prompts, hence its programs, the same) and rollout
# batches of at least 4 rows and prefill pieces of at least 64 positions (fewer programs).
RUN_ARGS = [
    *(
        arg
        for arg in SUITE_ARGS
        if not arg.startswith(("--config.interface.", "--config.weighting."))
    ),
    "--config.rollout.min_batch=4",
    "--config.rollout.min_prefill_width=64",
]


@pytest.fixture(scope="module")
def suite_qwen35(tmp_path_factory):
    """A tiny random Qwen3.5 (mixed layers) with the suite's tokenizer, as conftest's
    suite_model: the vocabulary's size and <|im_end|> as EOS."""
    path = str(tmp_path_factory.mktemp("suite_qwen35"))
    return hf_models.with_suite_tokenizer(
        path, lambda p, **kw: hf_models.build_tiny_qwen35(p, "qwen35_mixed", **kw)
    )


def _run_py(model, workdir, *extra):
    """run.py with RUN_ARGS on one CPU device; returns stderr."""
    cmd = [sys.executable, "run.py", *RUN_ARGS, f"--config.model.path={model}"]
    cmd += [f"--workdir={workdir}", *extra]
    proc = subprocess.run(
        cmd, cwd=REPO, env=cpu_env(1), capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def _end_to_end(model, workdir):
    """Two training steps in workdir, then --mode=eval and --mode=export; returns the training
    run's log."""
    log = _run_py(model, workdir, "--config.train.max_steps=2")
    _run_py(model, workdir, "--mode=eval", "--config.train.eval_limit=4")
    _run_py(model, workdir, "--mode=export")
    return log


@pytest.fixture(scope="module", autouse=True)
def end_to_end(request, tmp_path_factory):
    """(work directory, future of `_end_to_end`): started in the background (tests.devices)
    when the module's first test runs, beside the in-process parity tests, when the test that
    reads it is selected."""
    if not selected(request, test_run_py_trains_evaluates_and_exports_qwen35):
        yield None
        return
    workdir = tmp_path_factory.mktemp("qwen35_run") / "wd"
    job = in_background(_end_to_end, request.getfixturevalue("suite_qwen35"), workdir)
    yield workdir, job
    job.cancel()


def test_run_py_trains_evaluates_and_exports_qwen35(end_to_end):
    """Two training steps with shared prompts (the default), then --mode=eval of the trained
    policy and --mode=export. The training pass's log-probs of the sampled tokens, recomputed on
    the shared prompts' states, agree with the rollout engine's (its cache) within 1e-4."""
    workdir, job = end_to_end
    log = job.result()
    assert "share_prompt is off" not in log
    metrics = read_jsonl(str(workdir / "metrics.jsonl"))
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["rollout"]["tokens_generated"] > 0 and m["loss"]["loss_tokens"] > 0
        assert m["logprob_gap_sampler_vs_recomputed"] < 1e-4

    report = json.loads((workdir / "eval_step2.json").read_text())
    assert report["num_tasks"] == 4

    _assert_export_is_checkpoint(workdir, 2)

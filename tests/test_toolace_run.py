"""configs/toolace.py: the paper's hyper-parameters in ToolACE's format, its variants and targets,
and `run.py --mode=eval` end to end on a tiny random Llama with the real Llama 3 tokenizer."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from configs import qwen, toolace
from configs.base import VARIANTS
from seal_jax import config as config_lib
from tests import hf_models
from tests.devices import EXECUTION_BOUND_XLA_FLAGS, REPO, cpu_env


def test_hyper_parameters_are_the_qwen_setting_in_the_llama3_format():
    ours, paper = toolace.get_config().to_dict(), qwen.get_config().to_dict()
    assert ours["model"].pop("chat_format") == "llama3"
    assert paper["model"].pop("chat_format") == "auto"
    assert ours == paper
    config_lib.validate(toolace.get_config())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants_and_targets_combine_as_in_configs_qwen(variant):
    target = next(iter(toolace.TARGETS))
    config = toolace.get_config(f"{variant},{target}")
    expected = qwen.get_config(f"{variant},7b-{target[3:]}")
    expected.model.chat_format = "llama3"
    assert config.to_dict() == expected.to_dict()


@pytest.mark.parametrize("spec", ["nope", "seal,vanilla_grpo", "7b-v5p-8", "8b-v5p-8,8b-v5e-32"])
def test_bad_specs_are_refused(spec):
    with pytest.raises(ValueError, match="at most one variant"):
        toolace.get_config(spec)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny random Llama 3.1 (llama3 rope scaling) with the real Llama 3 tokenizer."""
    path = str(tmp_path_factory.mktemp("tiny_llama"))
    source = hf_models.llama_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    hf_models.build_tiny_checkpoint(
        path,
        "llama31",
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|eot_id|>"),
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(source, name), path)
    return path


def test_eval_runs_end_to_end_on_cpu(tiny_llama, tmp_path):
    """Two BFCL evaluation tasks under both protocols, 8 new tokens per reply (rollout batches
    of at least 2 rows and prefill pieces of at least 64 tokens: fewer programs to compile)."""
    workdir = tmp_path / "wd"
    cmd = [
        sys.executable,
        "run.py",
        "--config=configs/toolace.py",
        f"--config.model.path={tiny_llama}",
        "--mode=eval",
        f"--workdir={workdir}",
        "--config.train.eval_limit=2",
        "--config.train.eval_max_new_tokens=8",
        "--config.env.num_workers=1",
        "--config.rollout.min_batch=2",
        "--config.rollout.min_prefill_width=64",
    ]
    env = cpu_env(xla_flags=EXECUTION_BOUND_XLA_FLAGS)  # Llama 3's 128,256-token vocabulary
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(workdir / "eval_hf.json") as f:
        metrics = json.load(f)
    assert metrics["protocol"] == "release" and metrics["num_tasks"] == 2
    assert set(metrics["protocols"]) == {"release", "official"} and metrics["mean"] >= 0
    with open(workdir / "config.json") as f:
        assert json.load(f)["model"]["chat_format"] == "llama3"

"""run.py turns flag, config and checkpoint mistakes into one clear error line."""

import json
import os
import subprocess
import sys

import pytest

from configs.qwen import get_config as qwen_config
from tests.devices import REPO, cpu_env


def _run(*args, tmp_path):
    proc = subprocess.run(
        [sys.executable, "run.py", *args, f"--workdir={tmp_path}/wd"],
        cwd=REPO,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stderr.strip().splitlines()


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--config is required"),
        (["--config=configs/missing.py"], "config file 'configs/missing.py' not found"),
        (["--config=configs/qwen.py", "--config.optim.nope=1"], "unknown config key"),
        (["--config=configs/qwen.py", "--config.variant=seal"], "unknown config key"),
        (["--config=configs/qwen.py", "--config.optim.lr=fast"], "could not convert"),
        (["--config=configs/qwen.py", "--config.model.path=/nonexistent"], "does not exist"),
        (["--config=configs/qwen.py", "--config.model.param_dtype=int8"], "must be one of"),
        (["--config=configs/qwen.py", "--mode=dance"], "value should be one of"),
        (["--config=configs/qwen.py", "--config.rl.old_logprobs=cached"], "must be one of"),
        (["--config=configs/qwen.py", "--config.model.scan_unroll=0"], "use 1 or more"),
        (["--config=configs/tiny.py", "--config.sft.all_token_fraction=1.5"], "use 0.0 to 1.0"),
        (["--config=configs/tiny.py", "--config.rollout.slots=-1"], "use 0 (lockstep) or more"),
        (["--config=configs/qwen.py"], "set --config.model.path"),
        (["--config=configs/tiny.py", "--config.sft.categories=('nope',)"], "unknown ['nope']"),
        (
            ["--config=configs/tiny.py", "--config.sft.categories=('base:0',)"],
            "'base:0' needs a positive task count",
        ),
    ],
)
def test_user_errors_are_one_line(tmp_path, args, message):
    code, lines = _run(*args, tmp_path=tmp_path)
    errors = [line for line in lines if line.startswith("error:")]
    assert code == 2
    assert len(errors) == 1 and message in errors[0], lines
    assert not any("Traceback" in line for line in lines)


def test_variant_and_overrides_reach_the_saved_resolved_config(tmp_path):
    """run.py saves the resolved config (variant suffix and flag overrides applied) before it
    loads the model, so even a run that stops at a missing checkpoint leaves it."""
    _run(
        "--config=configs/qwen.py:closed_loop",
        "--config.model.path=/nonexistent",
        "--config.optim.lr=3e-6",
        tmp_path=tmp_path,
    )
    with open(os.path.join(tmp_path, "wd", "config.json")) as f:
        saved = json.load(f)
    assert saved["optim"]["lr"] == 3e-6 and saved["model"]["path"] == "/nonexistent"
    assert saved["interface"]["error_hints"] == "adaptive"  # the closed_loop variant's
    expected = qwen_config("closed_loop")
    expected.optim.lr, expected.model.path = 3e-6, "/nonexistent"
    assert saved == json.loads(json.dumps(expected.to_dict(), default=str))


@pytest.mark.parametrize(
    "variant, schema_cues, error_hints, weighting, closed_loop",
    [
        ("seal", "static", "off", True, True),
        ("vanilla_grpo", "off", "off", False, True),
        ("no_env_adaptation", "off", "off", True, True),
        ("no_reweighting", "static", "off", False, True),
        ("static_utilities", "static", "off", True, False),
        ("closed_loop", "adaptive", "adaptive", True, True),
    ],
)
def test_ablation_variants_set_their_switches(
    variant, schema_cues, error_hints, weighting, closed_loop
):
    config = qwen_config(variant)
    assert (config.interface.schema_cues, config.interface.error_hints) == (
        schema_cues,
        error_hints,
    )
    assert (config.weighting.enabled, config.weighting.closed_loop) == (weighting, closed_loop)

"""Compiles the setting of each hardware target of configs/qwen.py, configs/qwen35.py,
configs/toolace.py and configs/colab_tpu.py (run.py --mode=compile) and prints one table:
resident state and peak memory per chip of every program, whether it fits, and the step-time
estimate (seal_jax/estimate.py).
Needs libtpu (`pip install "libtpu==0.0.42.*"`); no TPU and no weights (model architectures from
benchmarks/model_configs).

    python -m benchmarks.compile_targets                       # every target
    python -m benchmarks.compile_targets --targets=7b-v5p-8 --out_dir=workdirs/compile_targets
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

from configs import colab_tpu, qwen, qwen35, toolace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# model size of a target's name -> (config file, model architecture in benchmarks/model_configs)
MODELS = {
    "7b": ("qwen.py", "qwen2.5-7b"),
    "3b": ("qwen.py", "qwen2.5-3b"),
    "4b": ("qwen35.py", "qwen3.5-4b"),
    "8b": ("toolace.py", "llama-3.1-8b"),
    "0.5b": ("colab_tpu.py", "qwen2.5-0.5b"),
    "1.5b": ("colab_tpu.py", "qwen2.5-1.5b"),
}
TARGETS = [*qwen.TARGETS, *qwen35.TARGETS, *toolace.TARGETS, *colab_tpu.TARGETS]
GIB = 2**30

flags.DEFINE_list("targets", TARGETS, "Targets of configs/{qwen,qwen35,toolace,colab_tpu}.py.")
flags.DEFINE_string("out_dir", "workdirs/compile_targets", "One work directory per target.")
FLAGS = flags.FLAGS


def compile_target(target: str) -> dict:
    """Runs run.py --mode=compile for a target; returns its compile.json (plus seconds, rc)."""
    workdir = os.path.join(FLAGS.out_dir, target)
    config, architecture = MODELS[target.split("-")[0]]
    model = os.path.join(ROOT, "benchmarks", "model_configs", architecture)
    cmd = [
        sys.executable,
        os.path.join(ROOT, "run.py"),
        f"--config={os.path.join(ROOT, 'configs', config)}:{target}",
        f"--config.model.path={model}",
        f"--workdir={workdir}",
        "--mode=compile",
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # compile for the topology; run nothing
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    path = os.path.join(workdir, "compile.json")
    if not os.path.isfile(path):
        raise RuntimeError(f"{target}: no compile.json (exit {proc.returncode}):\n{proc.stderr}")
    with open(path) as f:
        report = json.load(f)
    return {**report, "seconds": time.perf_counter() - start, "rc": proc.returncode}


def row(target: str, r: dict) -> str:
    """One markdown table row (GiB per chip)."""
    res, host = r["resident_bytes_per_chip"], r["host_bytes_per_chip"]
    peaks = {p["name"]: p["peak_bytes_per_chip"] / GIB for p in r["programs"]}
    s = r["settings"]
    update = f"{peaks['update_micro_step']:.1f}"
    if "update_optimizer_step" in peaks:  # Adam's state in host memory: a program of its own
        update += f" (optimizer step {peaks['update_optimizer_step']:.1f})"
    cells = [
        target,
        f"{r['chips']} x {r['device_kind']}, {r['hbm_bytes_per_chip'] / GIB:.1f}",
        f"{s['rollout_rows']} / {s['update_rows_per_micro_step']}",
        " / ".join(
            _resident(res[k], host.get(k, 0))
            for k in ("params", "opt_state", "reference", "kv_cache", "sampling_copy")
        ),
        update,
        *(f"{peaks.get(k, 0):.1f}" for k in ("logprob_pass", "sampling_copy", "rollout_prefill")),
        f"{peaks['rollout_decode']:.1f}",
        "yes" if r["fits"] else "**no**",
        f"{r['estimate']['update_s_per_step']:.0f} / {r['estimate']['rollout_s_per_step']:.0f} s, "
        f"{r['estimate']['paper_run_hours']:.1f} h",
    ]
    return "| " + " | ".join(cells) + " |"


def decode_row(target: str, r: dict) -> str:
    """One markdown row of the rollout figures: sampler group, weights gathered per token in the
    compiled decode loop, bytes each chip reads per decode step and tokens/s per chip at the HBM
    roofline (the estimate), the sampling copy's size and time."""
    d, gathers = r["estimate"]["decode"], r["decode_weight_gathers_per_token"]
    group = d["sampler_group_chips"] or "trainer's layout"
    cells = [
        target,
        str(group),
        f"{gathers['count']} / {gathers['bytes'] / GIB:.2f}",
        f"{d['bytes_per_chip_per_step'] / GIB:.2f}",
        f"{d['tokens_per_s_per_chip']:.0f}",
        f"{r['resident_bytes_per_chip']['sampling_copy'] / GIB:.2f} / {d['copy_s']:.3f}",
    ]
    return "| " + " | ".join(cells) + " |"


def _resident(chips: int, host: int) -> str:
    """A resident size on the chips, and what of it waits in host memory (GiB per chip)."""
    if chips == host:  # all of it in host memory (the reference with rl.reference_on_host)
        return f"{host / GIB:.1f} (host)"
    return f"{chips / GIB:.1f}" + (f" + {host / GIB:.1f} (host)" if host else "")


DECODE_HEADER = (
    "| target | sampler group (chips) | weight all-gathers per token: count / GiB per chip | "
    "GiB read per chip per decode step | tokens/s per chip (roofline) | sampling copy: GiB per "
    "chip / s |"
)


def main(argv: list[str]) -> None:
    """Compiles every target and prints the table."""
    del argv
    header = (
        "| target | chips, GiB each | rows: rollout chunk / micro-step | resident: params / "
        "optimizer / reference / KV cache / sampling copy | update | log-probs | sampling copy | "
        "prefill | decode | fits | estimate: update / rollout per step, 72 steps |"
    )
    lines, decode = [header, "|" + " --- |" * 11], []
    for target in FLAGS.targets:
        report = compile_target(target)
        print(
            f"{target}: {'fits' if report['fits'] else 'does NOT fit'} ({report['seconds']:.0f} s)",
            flush=True,
        )
        lines.append(row(target, report))
        decode.append(decode_row(target, report))
    print("\n".join(lines + ["", DECODE_HEADER, "|" + " --- |" * 6, *decode]))


if __name__ == "__main__":
    app.run(main)

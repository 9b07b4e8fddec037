"""The compile check of every hardware target, and the docs' tables built from it.

Compiles the setting of each target of configs/qwen.py, configs/toolace.py, configs/colab_tpu.py
and configs/qwen35.py (`run.py --mode=compile`: resident state and peak memory per chip of every
program, whether it fits, the step-time estimate of seal_jax/estimate.py) and records them in
benchmarks/results/compile_targets.json, with the jax and libtpu versions and the commit they
were compiled at; `--render` rewrites the tables between `<!-- compile_targets: NAME -->` and
`<!-- /compile_targets -->` in BUILD.md and benchmarks/README.md from that file
(tests/test_compile_tables.py checks that the docs equal the rendering).
Compiling needs libtpu (`pip install "libtpu==0.0.42.*"`); no TPU and no weights (the model
architectures are in benchmarks/model_configs). Rendering needs neither.

    python -m benchmarks.compile_targets                       # every target, then --render
    python -m benchmarks.compile_targets --targets=7b-v5p-8    # one target's entry, then --render
    python -m benchmarks.compile_targets --render              # the docs' tables from the JSON
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable

from absl import app, flags

from configs import colab_tpu, qwen, qwen35, toolace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "compile_targets.json")
DOCS = ("BUILD.md", "benchmarks/README.md")
# The files whose change can move a compiled figure (a commit's "dirty" flag looks at these).
COMPILE_INPUTS = ("seal_jax", "configs", "run.py", "benchmarks/model_configs")
# model size of a target's name -> (config file, model architecture in benchmarks/model_configs)
MODELS = {
    "7b": ("qwen.py", "qwen2.5-7b"),
    "3b": ("qwen.py", "qwen2.5-3b"),
    "4b": ("qwen35.py", "qwen3.5-4b"),
    "8b": ("toolace.py", "llama-3.1-8b"),
    "0.5b": ("colab_tpu.py", "qwen2.5-0.5b"),
    "1.5b": ("colab_tpu.py", "qwen2.5-1.5b"),
}
PAPER_TARGETS = [*qwen.TARGETS, *toolace.TARGETS]
TARGETS = [*PAPER_TARGETS, *colab_tpu.TARGETS, *qwen35.TARGETS]
GIB = 2**30

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line's flags, defined only when this runs as a script: the tests import the
    module's tables beside other benchmarks whose absl flags share these names."""
    flags.DEFINE_list("targets", TARGETS, "Targets of configs/{qwen,toolace,colab_tpu,qwen35}.py.")
    flags.DEFINE_string("out_dir", "workdirs/compile_targets", "One work directory per target.")
    flags.DEFINE_bool("render", False, "Only rewrite the docs' tables; compile nothing.")


def compile_target(target: str, out_dir: str) -> dict:
    """Runs run.py --mode=compile for a target; returns its compile.json with the config file,
    model, compile seconds, commit and versions."""
    workdir = os.path.join(out_dir, target)
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
    for program in report["programs"]:  # the compiler's refusal: its first line is the reason
        program["error"] = program["error"].strip().split("\n")[0]
    return {
        "config": f"configs/{config}",
        "model": f"benchmarks/model_configs/{architecture}",
        **report,
        "compile_s": round(time.perf_counter() - start, 1),
        **provenance(),
    }


def provenance() -> dict:
    """The last commit that changed COMPILE_INPUTS (with "-dirty" when they differ from it: a
    commit that changes only docs leaves it alone), the jax, jaxlib and libtpu versions, and
    today's date."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout

    dirty = "-dirty" if git("status", "--porcelain", "--", *COMPILE_INPUTS).strip() else ""
    return {
        "commit": git("log", "-1", "--format=%h", "--", *COMPILE_INPUTS).strip() + dirty,
        "versions": {p: importlib.metadata.version(p) for p in ("jax", "jaxlib", "libtpu")},
        "date": datetime.date.today().isoformat(),
    }


def load_results(path: str = RESULTS) -> dict:
    """The recorded compile checks: {"targets": {target: entry}}; empty when there is no file."""
    if not os.path.isfile(path):
        return {"targets": {}}
    with open(path) as f:
        return json.load(f)


def save_results(results: dict, path: str = RESULTS) -> None:
    """Writes the results, targets in TARGETS' order."""
    ordered = sorted(results["targets"].items(), key=lambda kv: _order(kv[0]))
    with open(path, "w") as f:
        json.dump({"targets": dict(ordered)}, f, indent=1)
        f.write("\n")


def _order(target: str) -> int:
    return TARGETS.index(target) if target in TARGETS else len(TARGETS)


# ----- the tables --------------------------------------------------------------------------------


def _gib(nbytes: float, digits: int = 1) -> str:
    return f"{nbytes / GIB:.{digits}f}"


def _peaks(r: dict) -> dict[str, float]:
    return {p["name"]: p["peak_bytes_per_chip"] for p in r["programs"]}


def _resident(r: dict) -> str:
    """Resident state per chip: params / optimizer / reference / KV cache / sampling copy, each
    with what of it waits in host memory."""
    res, host = r["resident_bytes_per_chip"], r["host_bytes_per_chip"]
    cells = []
    for key in ("params", "opt_state", "reference", "kv_cache", "sampling_copy"):
        chips, on_host = res[key], host.get(key, 0)
        if chips == on_host and on_host:  # all of it in host memory (rl.reference_on_host)
            cells.append(f"{_gib(on_host)} (host)")
        else:
            cells.append(_gib(chips) + (f" + {_gib(on_host)} (host)" if on_host else ""))
    return " / ".join(cells)


def _update(r: dict) -> str:
    """The update micro-step's peak, and the optimizer step's when it is a program of its own."""
    peaks = _peaks(r)
    cell = _gib(peaks["update_micro_step"])
    if "update_optimizer_step" in peaks:  # Adam's state in host memory
        cell += f" (optimizer step {_gib(peaks['update_optimizer_step'])})"
    return cell


def _rollout_peaks(r: dict) -> list[str]:
    peaks = _peaks(r)
    names = ("logprob_pass", "sampling_copy", "rollout_prefill", "rollout_decode")
    return [_gib(peaks.get(name, 0)) for name in names]


def _chips(r: dict) -> str:
    return f"{r['chips']} x {r['device_kind']}, {_gib(r['hbm_bytes_per_chip'])}"


def _rows(r: dict) -> str:
    s = r["settings"]
    return f"{s['rollout_rows']} / {s['update_rows_per_micro_step']}"


def _fits(r: dict) -> str:
    return "yes" if r["fits"] else "**no**"


def targets_row(target: str, r: dict) -> list[str]:
    """benchmarks/README.md's row of a paper-scale target (GiB per chip)."""
    e = r["estimate"]
    return [
        target,
        _chips(r),
        _rows(r),
        _resident(r),
        _update(r),
        *_rollout_peaks(r),
        _fits(r),
        f"{e['update_s_per_step']:.0f} / {e['rollout_s_per_step']:.0f} s, "
        f"{e['paper_run_hours']:.1f} h",
    ]


def decode_row(target: str, r: dict) -> list[str]:
    """The rollout figures: sampler group, weights gathered per token in the compiled decode
    loop, bytes each chip reads per decode step and tokens/s per chip at the HBM roofline (the
    estimate), the sampling copy's size and time."""
    d, gathers = r["estimate"]["decode"], r["decode_weight_gathers_per_token"]
    return [
        target,
        str(d["sampler_group_chips"] or "trainer's layout"),
        f"{gathers['count']} / {_gib(gathers['bytes'], 2)}",
        _gib(d["bytes_per_chip_per_step"], 2),
        f"{d['tokens_per_s_per_chip']:.0f}",
        f"{_gib(r['resident_bytes_per_chip']['sampling_copy'], 2)} / {d['copy_s']:.3f}",
    ]


# BUILD.md's shorter target names and chip names.
BUILD_LABELS = {
    "3b-v5e-8": "`3b-v5e-8` (Qwen2.5-3B)",
    "8b-v5p-8": "`8b-v5p-8` (ToolACE-2-Llama-3.1-8B, `configs/toolace.py`)",
    "8b-v5e-32": "`8b-v5e-32` (the same, Adam's state in host memory)",
}


def build_row(target: str, r: dict) -> list[str]:
    """BUILD.md's row: chips by their topology's name, the peaks in one cell, the fit with the
    estimate of the paper's 72 steps."""
    hours = f"{r['estimate']['paper_run_hours']:.0f} h"
    first = target == PAPER_TARGETS[0]
    return [
        BUILD_LABELS.get(target, f"`{target}`"),
        f"{r['chips']} x {r['topology'].split(':')[0]}, {_gib(r['hbm_bytes_per_chip'])}",
        _rows(r),
        _resident(r),
        " / ".join([_update(r), *_rollout_peaks(r)]),
        f"{_fits(r)} ({'72 steps: at most ~' if first else '~'}{hours})",
    ]


def colab_row(target: str, r: dict) -> list[str]:
    """The Colab notebook's row: one chip, the estimate per step and of the notebook's steps."""
    e = r["estimate"]
    steps = colab_tpu.get_config(target).train.max_steps
    minutes = steps * (e["update_s_per_step"] + e["rollout_s_per_step"]) / 60
    return [
        target,
        f"{r['device_kind']}, {_gib(r['hbm_bytes_per_chip'], 2)}",
        _rows(r),
        _resident(r),
        _update(r),
        *_rollout_peaks(r),
        _fits(r),
        f"{e['update_s_per_step']:.0f} / {e['rollout_s_per_step']:.0f} s",
        f"{minutes:.0f} min",
    ]


TARGETS_HEADER = (
    "target",
    "chips, GiB each",
    "rows: rollout chunk per host / micro-step",
    "resident: params / optimizer / reference / KV cache / sampling copy",
    "update",
    "log-probs",
    "sampling copy",
    "prefill",
    "decode",
    "fits",
    "estimate: update / rollout per step, 72 steps",
)
DECODE_HEADER = (
    "target",
    "sampler group (chips)",
    "weight all-gathers per token: count / GiB per chip",
    "GiB read per chip per decode step",
    "tokens/s per chip (roofline)",
    "sampling copy: GiB per chip / s",
)
BUILD_HEADER = (
    "target",
    "chips",
    "rows: rollout chunk per host / micro-step",
    "resident: params / optimizer / reference / KV / sampling copy",
    "peak: update / log-probs / sampling copy / prefill / decode",
    "fits",
)
COLAB_HEADER = (
    "target",
    "chip, GiB",
    "rows: rollout chunk / micro-step",
    *TARGETS_HEADER[3:10],
    "estimate: update / rollout per step",
    f"{colab_tpu.get_config().train.max_steps} steps",
)
# table name -> (header, row function, targets)
TableSpec = tuple[tuple[str, ...], Callable[[str, dict], list[str]], list[str]]
TABLES: dict[str, TableSpec] = {
    "build": (BUILD_HEADER, build_row, PAPER_TARGETS),
    "targets": (TARGETS_HEADER, targets_row, PAPER_TARGETS),
    "targets-decode": (DECODE_HEADER, decode_row, PAPER_TARGETS),
    "qwen35": (TARGETS_HEADER, targets_row, list(qwen35.TARGETS)),
    "qwen35-decode": (DECODE_HEADER, decode_row, list(qwen35.TARGETS)),
    "colab": (COLAB_HEADER, colab_row, list(colab_tpu.TARGETS)),
}
BEGIN = re.compile(r"^<!-- compile_targets: ([\w-]+) -->$", re.M)
END = "<!-- /compile_targets -->"


def table(name: str, results: dict) -> str:
    """The markdown of one table (TABLES) from the results, with the line saying where its
    figures come from."""
    if name not in TABLES:
        raise ValueError(f"unknown compile_targets table {name!r}: one of {', '.join(TABLES)}")
    header, row, targets = TABLES[name]
    missing = [t for t in targets if t not in results["targets"]]
    if missing:
        raise ValueError(
            f"{RESULTS} has no entry for {', '.join(missing)}: run "
            f"python -m benchmarks.compile_targets --targets={','.join(missing)}"
        )
    entries = [results["targets"][t] for t in targets]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row(t, e)) + " |" for t, e in zip(targets, entries)]
    return "\n".join(lines) + "\n\n" + _source(entries) + "\n"


def _source(entries: list[dict]) -> str:
    """Where a table's figures come from: versions, commits and dates of its entries."""

    def distinct(values: list[str]) -> str:
        return ", ".join(dict.fromkeys(values))

    libtpu = distinct([e["versions"]["libtpu"] for e in entries])
    jax_version = distinct([e["versions"]["jax"] for e in entries])
    return (
        f"<sub>Generated by `python -m benchmarks.compile_targets --render` from "
        f"benchmarks/results/compile_targets.json: libtpu {libtpu}, jax {jax_version}, compiled "
        f"at commit {distinct([e['commit'] for e in entries])} on "
        f"{distinct([e['date'] for e in entries])}.</sub>"
    )


def render(text: str, results: dict) -> str:
    """text with every marked table replaced by its rendering from the results.

    Raises:
      ValueError: an unknown table name, a marker without its end, or a target without results.
    """
    out, pos = [], 0
    for begin in BEGIN.finditer(text):
        if begin.start() < pos:
            raise ValueError(f"compile_targets table {begin.group(1)!r} starts inside another")
        end = text.find(END, begin.end())
        if end < 0:
            raise ValueError(f"compile_targets table {begin.group(1)!r} has no {END!r}")
        out += [text[pos : begin.end()], "\n", table(begin.group(1), results)]
        pos = end
    return "".join(out) + text[pos:]


def marked_tables(text: str) -> list[str]:
    """The names of the tables a document marks, in order."""
    return BEGIN.findall(text)


def render_docs(results: dict) -> list[str]:
    """Rewrites DOCS' marked tables from the results; returns the docs that changed."""
    changed = []
    for doc in DOCS:
        path = os.path.join(ROOT, doc)
        with open(path) as f:
            text = f.read()
        new = render(text, results)
        if new != text:
            with open(path, "w") as f:
                f.write(new)
            changed.append(doc)
    return changed


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
    """Compiles the targets (recording each as it finishes), then renders the docs' tables."""
    del argv
    unknown = [t for t in FLAGS.targets if t not in TARGETS]
    if unknown:
        _fail(f"unknown targets {', '.join(unknown)}; targets: {', '.join(TARGETS)}")
    results = load_results()
    if not FLAGS.render:
        for target in FLAGS.targets:
            entry = compile_target(target, FLAGS.out_dir)
            results["targets"][target] = entry
            save_results(results)  # each target as it finishes: a long run keeps its progress
            verdict = "fits" if entry["fits"] else "does NOT fit"
            print(f"{target}: {verdict} ({entry['compile_s']:.0f} s)", flush=True)
    try:
        changed = render_docs(results)
    except ValueError as error:
        _fail(str(error))
    print(f"tables rewritten in: {', '.join(changed) or 'none (already up to date)'}")


if __name__ == "__main__":
    define_flags()
    app.run(main)

"""SEAL versus vanilla GRPO and the ablation rows on the generated suite (configs/tiny.py).

    python -m benchmarks.seal_vs_baselines [--seeds=3] [--out_dir=DIR]
        [--variants=vanilla_grpo,...] [--max_steps=N] [--eval_limit=N] [--sft_steps=N] ...

Every variant of configs.base.VARIANTS runs `run.py --config=configs/tiny.py:<variant>` with
the same budget and seeds (`--config.seed=<s>`), one run at a time. For each seed the scratch
policy and its warm start are built once (by the first variant) and copied into the other
variants' work directories, so every variant of a seed starts RL from the very same policy
(run.py reuses a work directory's `scratch_policy/` and `warm_start/`); --warm_starts_from takes
them from an earlier comparison's run directories instead, which saves a warm start (~7 min) per
seed when only RL settings changed. The final evaluation of
each run is read from its `metrics.jsonl`; the script writes, into --out_dir:

* `results.md`: mean and standard deviation over seeds of the final evaluation success per
  category and of their mean, plus the warm-started policy's (step 0) mean and the mean with
  BFCL's irrelevance check as well (before -> final; see EpisodeResult.strict_success);
* `results.json`: every run's before / final numbers and wall time;
* `comparison.png`: one grouped bar chart (final success per category and mean, +- std).

The budget flags shrink every run alike; without them the runs use configs/tiny.py's budget
(about 15 minutes each on 2 CPU cores: the full 6 variants x 3 seeds takes hours).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configs.base import VARIANTS  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("variants", list(VARIANTS), "Variants (configs.base.VARIANTS) to run.")
flags.DEFINE_integer("seeds", 3, "Seeds per variant: 0 .. seeds-1.")
flags.DEFINE_integer("first_seed", 0, "First seed.")
flags.DEFINE_string("out_dir", "workdirs/seal_vs_baselines", "Table, plot, JSON.")
flags.DEFINE_string("workdir_root", "", "Run work directories (default: <out_dir>/runs).")
flags.DEFINE_bool("reuse", False, "Keep finished runs found in the work directories.")
flags.DEFINE_string("config", "configs/tiny.py", "Config file the variants are taken from.")
flags.DEFINE_string(
    "warm_starts_from",
    "",
    "An earlier comparison's run directory (its <out_dir>/runs): each seed copies scratch_policy "
    "and warm_start from a <variant>_seed<s> there. They are used as they are, so they must come "
    "from the same model and sft settings.",
)
# Budget overrides (None: the config's value), applied to every run alike.
flags.DEFINE_integer("max_steps", None, "train.max_steps")
flags.DEFINE_integer("eval_every", None, "train.eval_every (>= max_steps: only before and after)")
flags.DEFINE_integer("eval_limit", None, "train.eval_limit (evaluation tasks; 0: all 200)")
flags.DEFINE_integer("sft_steps", None, "sft.steps")
flags.DEFINE_integer("batch_tasks", None, "train.batch_tasks")
flags.DEFINE_integer("mini_batch_tasks", None, "train.mini_batch_tasks")
flags.DEFINE_integer("group_size", None, "rl.group_size")
flags.DEFINE_multi_string("override", [], "Extra run.py flags, e.g. --override=--config.x=1.")

BUDGET = {
    "max_steps": "train.max_steps",
    "eval_every": "train.eval_every",
    "eval_limit": "train.eval_limit",
    "sft_steps": "sft.steps",
    "batch_tasks": "train.batch_tasks",
    "mini_batch_tasks": "train.mini_batch_tasks",
    "group_size": "rl.group_size",
}
SHARED = ("scratch_policy", "warm_start")  # built once per seed, copied to the other variants


def budget_flags() -> list[str]:
    """The run.py flags every run gets: the budget overrides given, then --override."""
    out = [f"--config.{key}={getattr(FLAGS, name)}" for name, key in BUDGET.items()
           if getattr(FLAGS, name) is not None]  # fmt: skip
    return out + list(FLAGS.override)


def eval_records(workdir: str) -> list[dict]:
    """The evaluation lines of a run's metrics.jsonl, in order."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            if isinstance(record.get("eval"), dict) and "accuracy" in record["eval"]:
                out.append(record)
    return out


def summary(workdir: str) -> dict | None:
    """Before-RL (first) and final (last) evaluation of a run, or None without two evals."""
    evals = eval_records(workdir)
    if len(evals) < 2:
        return None
    first, last = evals[0], evals[-1]
    return {
        "before": {**first["eval"]["accuracy"], "mean": first["eval"]["mean"]},
        "final": {**last["eval"]["accuracy"], "mean": last["eval"]["mean"]},
        # The mean with BFCL's irrelevance check too (None in logs written before it existed).
        "strict": [first["eval"].get("strict_mean"), last["eval"].get("strict_mean")],
        "final_step": last["step"],
    }


def earlier_warm_start(seed: int) -> str:
    """The run directory under --warm_starts_from that holds seed `seed`'s warm start."""
    root = os.path.abspath(FLAGS.warm_starts_from)
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    for name in names:
        path = os.path.join(root, name)
        if name.endswith(f"_seed{seed}") and all(
            os.path.isdir(os.path.join(path, s)) for s in SHARED
        ):
            return path
    raise app.UsageError(f"--warm_starts_from: no <variant>_seed{seed} with {SHARED} in {root}")


def run_one(variant: str, seed: int, workdir: str, shared_from: str | None) -> dict:
    """Runs one variant/seed to the end (or reuses a finished run); returns its summary."""
    if FLAGS.reuse and summary(workdir) and os.path.isfile(os.path.join(workdir, "wall_s")):
        with open(os.path.join(workdir, "wall_s")) as f:
            return {**summary(workdir), "wall_s": float(f.read())}
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    if shared_from:
        for name in SHARED:
            src = os.path.join(shared_from, name)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(workdir, name))
    cmd = [sys.executable, os.path.join(ROOT, "run.py"), f"--config={FLAGS.config}:{variant}",
           f"--workdir={workdir}", f"--config.seed={seed}", *budget_flags()]  # fmt: skip
    print(f"[{time.strftime('%H:%M:%S')}] {variant} seed {seed}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with open(os.path.join(workdir, "run.log"), "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if rc != 0:
        raise RuntimeError(f"{variant} seed {seed} failed (exit {rc}); see {workdir}/run.log")
    result = summary(workdir)
    if result is None:
        raise RuntimeError(f"{variant} seed {seed}: fewer than two evaluations in metrics.jsonl")
    with open(os.path.join(workdir, "wall_s"), "w") as f:
        f.write(f"{wall:.1f}")
    print(f"    done in {wall:.0f} s: mean {100 * result['before']['mean']:.1f} -> "
          f"{100 * result['final']['mean']:.1f}", flush=True)  # fmt: skip
    return {**result, "wall_s": wall}


def table(results: dict[str, list[dict]]) -> tuple[list[str], list[str]]:
    """Markdown lines of the table, and the column keys (categories, then mean)."""
    keys = []
    for runs in results.values():
        for r in runs:
            keys += [k for k in r["final"] if k != "mean" and k not in keys]
    keys.append("mean")
    seeds = max(len(runs) for runs in results.values())
    header = ["variant", *keys, "mean at step 0 (warm start)", "strict mean: step 0 -> final"]
    header += ["runs", "wall s / run"]
    lines = [
        f"Final evaluation success (%), mean ± std over {seeds} seed(s) (std: ddof 0).",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |",
    ]
    for variant, runs in results.items():
        cells = [variant]
        for k in keys:
            values = 100 * np.asarray([r["final"][k] for r in runs])
            cells.append(f"{values.mean():.1f} ± {values.std():.1f}")
        before = 100 * np.asarray([r["before"]["mean"] for r in runs])
        strict = [r["strict"] for r in runs]
        strict_cell = "n/a"
        if all(None not in pair for pair in strict):
            strict_cell = " -> ".join(f"{100 * np.mean(col):.1f}" for col in zip(*strict))
        cells += [f"{before.mean():.1f}", strict_cell, str(len(runs)),
                  f"{np.mean([r['wall_s'] for r in runs]):.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines, keys


def plot(results: dict[str, list[dict]], keys: list[str], path: str, title: str) -> None:
    """Grouped bars: final success per column (categories, mean) per variant, +- std."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(keys) + 2), 4.2))
    width = 0.8 / max(1, len(results))
    x = np.arange(len(keys))
    for i, (variant, runs) in enumerate(results.items()):
        values = 100 * np.asarray([[r["final"][k] for k in keys] for r in runs])
        ax.bar(x + (i - (len(results) - 1) / 2) * width, values.mean(0), width,
               yerr=values.std(0), capsize=2, label=variant)  # fmt: skip
    before = np.mean([100 * r["before"]["mean"] for runs in results.values() for r in runs])
    ax.axhline(before, color="black", linestyle="--", linewidth=1, label="warm start (mean)")
    ax.set_xticks(x, keys)
    ax.set_ylabel("final evaluation success (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> None:
    """Runs every variant x seed, then writes results.md, results.json, comparison.png."""
    del argv
    unknown = [v for v in FLAGS.variants if v not in VARIANTS]
    if unknown:
        raise app.UsageError(f"unknown variants {unknown}; use some of {', '.join(VARIANTS)}")
    out_dir = os.path.abspath(FLAGS.out_dir)
    root = os.path.abspath(FLAGS.workdir_root or os.path.join(out_dir, "runs"))
    os.makedirs(out_dir, exist_ok=True)
    seeds = range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds)
    results: dict[str, list[dict]] = {v: [] for v in FLAGS.variants}
    start = time.perf_counter()
    for seed in seeds:
        shared_from = earlier_warm_start(seed) if FLAGS.warm_starts_from else None
        for variant in FLAGS.variants:
            workdir = os.path.join(root, f"{variant}_seed{seed}")
            results[variant].append({"seed": seed, **run_one(variant, seed, workdir, shared_from)})
            shared_from = shared_from or workdir
    total = time.perf_counter() - start
    budget = " ".join(budget_flags()) or "(configs/tiny.py defaults)"
    lines, keys = table(results)
    title = f"{FLAGS.config}, seeds {list(seeds)}, budget: {budget}"
    plot(results, keys, os.path.join(out_dir, "comparison.png"), title)
    text = [
        "# SEAL versus the baselines on the generated suite",
        "",
        f"Config: `{FLAGS.config}`; seeds: {list(seeds)}; budget overrides: `{budget}`.",
        f"Total wall time: {total / 60:.1f} min.",
        "",
        *lines,
        "",
        "![comparison](comparison.png)",
        "",
    ]
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(text))
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"budget": budget_flags(), "seeds": list(seeds), "runs": results}, f, indent=1)
    print("\n".join(text))


if __name__ == "__main__":
    app.run(main)

"""SEAL versus vanilla GRPO and the ablation arms on the generated suite (configs/tiny.py).

    python -m benchmarks.seal_vs_baselines [--arms=seal,vanilla_grpo,...] [--seeds=10]
        [--out_dir=DIR] [--rerun] [--report_only] [--time_budget_min=M] [--recorded=JSON]
        [--baseline=ARM] [--max_steps=N] [--eval_limit=N] [--sft_steps=N] ...

An arm (ARMS) is a variant of configs.base.VARIANTS plus its own run.py flags: every
variant is an arm with none, and `released_interface` is `seal` with the released preset's
static components (its schema cues) switched back on, which configs/tiny.py switches off. Each
arm x seed runs `run.py --config=configs/tiny.py:<variant> --config.seed=<s> <arm flags>`, with
the same budget, one run at a time, in `<out_dir>/runs/<arm>_seed<s>`.

The study protocol (benchmarks/README.md, "The powered comparison"): seeds 0-9, every arm at
configs/tiny.py's budget and evaluation, the primary metric the official mean final evaluation
success, compared with vanilla GRPO by seed-paired differences (95% paired t interval and
percentile bootstrap over seeds, BOOTSTRAP_RESAMPLES resamples, RNG seed BOOTSTRAP_SEED).

Runs are resumable across sessions: a finished run (two evaluations in metrics.jsonl and the
`wall_s` marker written when run.py exits cleanly) is kept (`--rerun` runs it again), an
unfinished one starts again. Per seed the scratch policy and warm start are built once, by the arm
with the most static interface components, then the most adaptive ones (it runs first;
`warm_start_order`), and copied into every other arm's directory, so all arms of a seed start
RL from the same policy;
`--warm_starts_from` takes them from an earlier comparison's run directory instead.
`--report_only` runs nothing and reports the finished runs found (n per arm shown), so a partial
study can be reported mid-way.

Run directories need not outlive a session: `--recorded=<results.json>` (an earlier report's
JSON, committed under benchmarks/results/) counts the runs it holds as finished. They are reported
beside the runs on disk (a run directory of the same arm and seed takes precedence) and not run
again, except the arm that builds a seed's warm start when another arm of that seed still has to
run and no warm start is on disk: it runs again, and the report checks that its warm start is the
one the recorded arms of that seed had. Recorded runs carry no per-trajectory weights, so the
pooled weight quantiles are left out when any run is recorded.

Writes into --out_dir:
* `results.md`: per arm the mean final success (official and strict) per category; per arm the
  paired difference to vanilla GRPO (or --baseline) with both intervals; the diagnosis tags of
  the training rollouts, the per-trajectory weights, and which categories never show a tag the
  weighting acts on;
* `results.json`: the same numbers and every run's;
* `comparison.png` (final success per category) and `paired_differences.png`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from scipy import stats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configs.base import INTERFACE_COMPONENTS, INTERFACE_PRESETS, VARIANTS  # noqa: E402

# ---- the arms --------------------------------------------------------------------------------

# The released preset's static components as run.py flags: configs/tiny.py switches static
# components off (a scratch policy cannot read cue text), these switch them back on.
RELEASED_FLAGS = tuple(
    f"--config.interface.{c}=static"
    for c in INTERFACE_COMPONENTS
    if INTERFACE_PRESETS["released"][c] == "static"
)
# Study arm -> (configs.base.VARIANTS entry, its own run.py flags, applied after all others).
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {v: (v, ()) for v in VARIANTS} | {
    "released_interface": ("seal", RELEASED_FLAGS),  # SEAL with the released preset really on
    "no_reweighting_released": ("no_reweighting", RELEASED_FLAGS),  # the paper's ablation row
}
# no_reweighting is vanilla_grpo under configs/tiny.py (which switches the released preset's
# static cues off): its ablation row runs with the cues on, beside released_interface.
STUDY_ARMS = (
    "seal",
    "vanilla_grpo",
    "static_utilities",
    "released_interface",
    "no_reweighting_released",
    "closed_loop",
)
BASELINE = "vanilla_grpo"  # every other arm is compared with it, seed by seed (--baseline)
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
SHARED = ("scratch_policy", "warm_start")  # built once per seed, copied to the other arms
BUDGET = {
    "max_steps": "train.max_steps",
    "eval_every": "train.eval_every",
    "eval_limit": "train.eval_limit",
    "sft_steps": "sft.steps",
    "batch_tasks": "train.batch_tasks",
    "mini_batch_tasks": "train.mini_batch_tasks",
    "group_size": "rl.group_size",
}
WEIGHT_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)

FLAGS = flags.FLAGS
flags.DEFINE_list("arms", list(STUDY_ARMS), f"Arms to run (of {', '.join(ARMS)}).")
flags.DEFINE_alias("variants", "arms")
flags.DEFINE_integer("seeds", 10, "Seeds per arm: first_seed .. first_seed + seeds - 1.")
flags.DEFINE_integer("first_seed", 0, "First seed.")
flags.DEFINE_string("out_dir", "workdirs/seal_vs_baselines_study", "Tables, plots, JSON.")
flags.DEFINE_string("workdir_root", "", "Run work directories (default: <out_dir>/runs).")
flags.DEFINE_bool("reuse", True, "Keep finished runs (the default; --rerun overrides).")
flags.DEFINE_bool("rerun", False, "Run finished runs again (their warm starts are kept).")
flags.DEFINE_bool("report_only", False, "Run nothing: report the finished runs found.")
flags.DEFINE_string(
    "baseline", BASELINE, "The arm every other arm is compared with, seed by seed (one of --arms)."
)
flags.DEFINE_multi_string(
    "recorded",
    [],
    "An earlier report's results.json: its runs count as finished (not run again, reported "
    "unless a run directory of the same arm and seed exists).",
)
flags.DEFINE_float("time_budget_min", 0, "Start no new run after this many minutes (0: no cap).")
flags.DEFINE_string("config", "configs/tiny.py", "Config file the variants are taken from.")
flags.DEFINE_string(
    "warm_starts_from",
    "",
    "An earlier comparison's run directory (its <out_dir>/runs): each seed copies scratch_policy "
    "and warm_start from a <arm>_seed<s> there. They are used as they are, so they must come "
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


def budget_flags() -> list[str]:
    """The run.py flags every run gets: the budget overrides given, then --override."""
    out = [
        f"--config.{key}={getattr(FLAGS, name)}"
        for name, key in BUDGET.items()
        if getattr(FLAGS, name) is not None
    ]
    return out + list(FLAGS.override)


def run_args(arm: str, seed: int) -> list[str]:
    """run.py's flags for one arm and seed (all but --workdir)."""
    variant, own = ARMS[arm]
    return [f"--config={FLAGS.config}:{variant}", f"--config.seed={seed}", *budget_flags(), *own]


# ---- running ---------------------------------------------------------------------------------


def has_shared(path: str) -> bool:
    """Whether a run directory holds a complete scratch policy and warm start."""
    return all(os.path.isfile(os.path.join(path, s, "config.json")) for s in SHARED)


def earlier_warm_start(seed: int) -> str:
    """The run directory under --warm_starts_from that holds seed `seed`'s warm start."""
    root = os.path.abspath(FLAGS.warm_starts_from)
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    for name in names:
        path = os.path.join(root, name)
        if name.endswith(f"_seed{seed}") and has_shared(path):
            return path
    raise app.UsageError(f"--warm_starts_from: no <arm>_seed{seed} with {SHARED} in {root}")


def shared_source(root: str, seed: int) -> str | None:
    """Where seed `seed`'s warm start comes from: --warm_starts_from, else the first arm in
    `warm_start_order` that built one."""
    if FLAGS.warm_starts_from:
        return earlier_warm_start(seed)
    for arm in warm_start_order(ARMS):
        path = os.path.join(root, f"{arm}_seed{seed}")
        if has_shared(path):
            return path
    return None


def interface_modes(arm: str) -> dict[str, str]:
    """The arm's interface component -> mode ("off", "static", "adaptive"), from its config."""
    variant, own = ARMS[arm]
    module = importlib.import_module(FLAGS.config.removesuffix(".py").replace("/", "."))
    config = module.get_config(variant)
    for flag in own:  # --config.<path>=<value>
        path, _, value = flag.removeprefix("--config.").partition("=")
        *parents, leaf = path.split(".")
        node = config
        for name in parents:
            node = node[name]
        node[leaf] = value
    return {c: config.interface[c] for c in INTERFACE_COMPONENTS}


def warm_start_order(arms: Sequence[str]) -> list[str]:
    """Arms in the order they run. The first arm of a seed builds the warm start the others
    copy, on the plain view and the views its training shows (`seal_jax.modes.
    warm_start_views`), so the arms with the most static components (shown from the first
    step, the same for every arm that has them) come first, then those with the most adaptive
    ones: in the study, `released_interface` builds it, and no arm meets a fixed view its warm
    start never saw (the closed loop's changing views are covered only when it builds)."""

    def rank(arm: str) -> tuple[int, int]:
        modes = interface_modes(arm).values()
        return -sum(m == "static" for m in modes), -sum(m != "off" for m in modes)

    return sorted(arms, key=rank)


def finished(workdir: str) -> bool:
    """A run that ended cleanly: two evaluations and the wall_s marker."""
    return os.path.isfile(os.path.join(workdir, "wall_s")) and len(eval_records(workdir)) >= 2


def prepare_workdir(workdir: str, source: str | None) -> None:
    """Empties `workdir` for a fresh run, keeping its own warm start unless `source` has one."""
    os.makedirs(workdir, exist_ok=True)
    own = source is None or os.path.samefile(source, workdir)
    keep = set(SHARED) if own and has_shared(workdir) else set()
    for name in os.listdir(workdir):
        path = os.path.join(workdir, name)
        if name in keep:
            continue
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    if source and not own:
        for name in SHARED:
            shutil.copytree(os.path.join(source, name), os.path.join(workdir, name))


def run_one(arm: str, seed: int, workdir: str, source: str | None) -> bool:
    """Runs one arm/seed to the end unless a finished run is kept; False when run.py failed."""
    args = run_args(arm, seed)
    if finished(workdir) and not FLAGS.rerun:
        saved = read_json(os.path.join(workdir, "run_args.json"))
        if saved is not None and saved != args:
            sys.exit(
                f"error: {workdir} finished with other flags ({saved} != {args}): use --rerun "
                "or another --out_dir"
            )
        print(f"{arm} seed {seed}: kept (finished)", flush=True)
        return True
    prepare_workdir(workdir, source)
    with open(os.path.join(workdir, "run_args.json"), "w") as f:
        json.dump(args, f)
    cmd = [sys.executable, os.path.join(ROOT, "run.py"), *args, f"--workdir={workdir}"]
    print(f"[{time.strftime('%H:%M:%S')}] {arm} seed {seed}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with open(os.path.join(workdir, "run.log"), "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if rc != 0 or len(eval_records(workdir)) < 2:
        print(f"    FAILED (exit {rc}); see {workdir}/run.log", flush=True)
        return False
    with open(os.path.join(workdir, "wall_s"), "w") as f:
        f.write(f"{wall:.1f}")
    print(f"    done in {wall:.0f} s", flush=True)
    return True


def to_run(root: str, order: Sequence[str], seed: int, recorded: Mapping) -> list[str]:
    """The arms of `order` that seed `seed` still runs: those not recorded, led by the warm
    start's builder (order[0]) when they need a warm start that is not on disk."""
    pending = [a for a in order if seed not in recorded.get(a, {})]
    if pending and order[0] not in pending and shared_source(root, seed) is None:
        pending.insert(0, order[0])
    return pending


def run_study(
    root: str, arms: Sequence[str], seeds: Sequence[int], recorded: Mapping[str, Mapping]
) -> list[str]:
    """Runs (or keeps) every arm x seed not in `recorded` (see `to_run`), seed by seed; returns
    the failed runs' names."""
    start, failed = time.perf_counter(), []
    order = warm_start_order(arms)
    for seed in seeds:
        for arm in to_run(root, order, seed, recorded):
            workdir = os.path.join(root, f"{arm}_seed{seed}")
            elapsed = (time.perf_counter() - start) / 60
            if FLAGS.time_budget_min and elapsed > FLAGS.time_budget_min and not finished(workdir):
                print(f"--time_budget_min={FLAGS.time_budget_min} spent: no new run", flush=True)
                return failed
            if not run_one(arm, seed, workdir, shared_source(root, seed)):
                failed.append(f"{arm}_seed{seed}")
    return failed


# ---- reading runs ----------------------------------------------------------------------------


def read_json(path: str) -> object | None:
    """A JSON file's content, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def metric_records(workdir: str) -> list[dict]:
    """Every line of a run's metrics.jsonl, in order (a torn last line is skipped)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def is_eval(record: Mapping) -> bool:
    """Whether a metrics.jsonl record holds an evaluation."""
    return isinstance(record.get("eval"), dict) and "accuracy" in record["eval"]


def eval_records(workdir: str) -> list[dict]:
    """The evaluation lines of a run's metrics.jsonl, in order."""
    return [r for r in metric_records(workdir) if is_eval(r)]


def training_records(records: Sequence[dict]) -> list[dict]:
    """The training-step records (those with rollout metrics), the last one of each step."""
    by_step = {r["step"]: r for r in records if isinstance(r.get("rollout"), dict)}
    return [by_step[s] for s in sorted(by_step)]


def eval_summary(evals: Sequence[dict]) -> dict:
    """Before-RL (first) and final (last) evaluation, official and strict (None if absent)."""

    def scores(record: dict, strict: bool) -> dict | None:
        e = record["eval"]
        if strict and "strict_accuracy" not in e:
            return None
        acc = e["strict_accuracy" if strict else "accuracy"]
        return {**acc, "mean": e["strict_mean" if strict else "mean"]}

    first, last = evals[0], evals[-1]
    return {
        "before": scores(first, False),
        "final": scores(last, False),
        "strict_before": scores(first, True),
        "strict_final": scores(last, True),
        "final_step": last["step"],
    }


def warm_start_digest(workdir: str) -> str | None:
    """A short SHA-256 of the warm start's weights (None without a warm start)."""
    path = os.path.join(workdir, "warm_start")
    if not os.path.isdir(path):
        return None
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for name in files:
        with open(os.path.join(path, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:12]


def final_tag_counts(workdir: str, step: int) -> dict[str, int] | None:
    """All-time training tag counts from the final checkpoint's host state (None if absent)."""
    host = read_json(os.path.join(workdir, "checkpoints", str(step), "host", "metadata"))
    try:
        return {t: int(n) for t, n in host["profile"]["tags"]["total_count"].items()}  # type: ignore[index]
    except (TypeError, KeyError):
        return None


def load_run(workdir: str, seed: int) -> dict:
    """One finished run: its evaluations, flags, warm start and training statistics."""
    records = metric_records(workdir)
    evals = [r for r in records if is_eval(r)]
    config = read_json(os.path.join(workdir, "config.json")) or {}
    train = training_records(records)
    with open(os.path.join(workdir, "wall_s")) as f:
        wall = float(f.read())
    config_digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    return {
        "seed": seed,
        **eval_summary(evals),
        "wall_s": wall,
        "run_args": read_json(os.path.join(workdir, "run_args.json")),
        "config_digest": config_digest[:12],
        "warm_start": warm_start_digest(workdir),
        "weighting_enabled": bool(config.get("weighting", {}).get("enabled", True)),
        "tags": run_tag_stats(train, final_tag_counts(workdir, evals[-1]["step"])),
        "weights": run_weight_stats(train, rows_per_step(config)),
        "acted_on": sorted(acted_on_tags(train, config)),
        "category_tags": category_tag_counts(evals, train),
    }


def read_recorded(paths: Sequence[str], arms: Sequence[str]) -> dict[str, dict[int, dict]]:
    """The runs of `arms` in earlier reports' results.json files, {arm: {seed: run}}, each
    marked with `recorded` (its file); a later file wins over an earlier one. Every run's
    run.py flags must be the ones this study gives it."""
    out: dict[str, dict[int, dict]] = {}
    for path in paths:
        data = read_json(path)
        if not isinstance(data, dict) or not isinstance(data.get("runs"), dict):
            raise app.UsageError(f"--recorded={path}: not a results.json with runs")
        for arm in arms:
            for run in data["runs"].get(arm, []):
                expected = run_args(arm, run["seed"])
                if run["run_args"] != expected:
                    raise app.UsageError(
                        f"--recorded={path}: {arm} seed {run['seed']} ran with other flags "
                        f"({run['run_args']} != {expected})"
                    )
                out.setdefault(arm, {})[run["seed"]] = {**run, "recorded": path}
    return out


def collect(
    root: str, arms: Sequence[str], recorded: Mapping[str, Mapping[int, dict]] | None = None
) -> dict[str, list[dict]]:
    """The finished runs under `root` and the `recorded` ones whose arm and seed have none
    there, per arm (seed order); arms without any are left out."""
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    out: dict[str, list[dict]] = {}
    for arm in arms:
        runs = dict((recorded or {}).get(arm, {}))
        for name in names:
            match = re.fullmatch(re.escape(arm) + r"_seed(\d+)", name)
            path = os.path.join(root, name)
            if match and finished(path):
                seed = int(match.group(1))
                runs[seed] = load_run(path, seed)
        if runs:
            out[arm] = [runs[s] for s in sorted(runs)]
    return out


# ---- statistics (pure) -----------------------------------------------------------------------


def paired_differences(
    arm: Mapping[int, float], baseline: Mapping[int, float]
) -> tuple[list[int], np.ndarray]:
    """The seeds both have (sorted) and `arm - baseline` on each of them."""
    seeds = sorted(set(arm) & set(baseline))
    return seeds, np.asarray([arm[s] - baseline[s] for s in seeds], dtype=np.float64)


def t_interval(diffs: Sequence[float], level: float = CONFIDENCE) -> tuple[float, float]:
    """Paired t interval for the mean difference: mean +- t_{n-1} * sd / sqrt(n) (sd: ddof 1).

    NaN for fewer than two differences; zero width when they are all equal.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return float(d.mean() - half), float(d.mean() + half)


def bootstrap_interval(
    diffs: Sequence[float],
    level: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean difference, resampling seeds with replacement.

    `np.random.default_rng(seed).integers(0, n, (resamples, n))` draws the resamples; the
    bounds are np.percentile (linear) of their means at (1 -+ level) / 2. NaN for n < 2.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        return math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, d.size, size=(resamples, d.size))
    means = d[idx].mean(axis=1)
    lo, hi = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def paired_summary(arm: Mapping[int, float], baseline: Mapping[int, float]) -> dict:
    """n, seeds, differences, their mean and sd (ddof 1), the t and the bootstrap interval."""
    seeds, d = paired_differences(arm, baseline)
    return {
        "n": len(seeds),
        "seeds": seeds,
        "diffs": d.tolist(),
        "mean": float(d.mean()) if d.size else math.nan,
        "sd": float(d.std(ddof=1)) if d.size > 1 else math.nan,
        "t_interval": list(t_interval(d)),
        "bootstrap_interval": list(bootstrap_interval(d)),
    }


# ---- tags and weights of the training rollouts -----------------------------------------------


def rows_per_step(config: Mapping) -> int:
    """Trajectories per training step: train.batch_tasks x rl.group_size."""
    return int(config.get("train", {}).get("batch_tasks", 0)) * int(
        config.get("rl", {}).get("group_size", 0)
    )


def run_tag_stats(train: Sequence[dict], counts: Mapping[str, int] | None) -> dict:
    """Per tag: its share of the step's turn tags averaged over steps, and its count.

    Counts come from per-trajectory records (`trajectories.tags`) when metrics.jsonl has them,
    else from the final checkpoint's all-time totals (`counts`), else None.
    """
    tags = sorted({t for r in train for t in r["rollout"].get("tag_fraction", {})})
    share = {
        t: float(np.mean([r["rollout"].get("tag_fraction", {}).get(t, 0.0) for r in train]))
        for t in tags
    }
    if train and all("trajectories" in r for r in train):
        counted: dict[str, int] = {}
        for r in train:
            for turn_tags in r["trajectories"]["tags"]:
                for t in turn_tags:
                    counted[t] = counted.get(t, 0) + 1
        counts = counted
    return {"steps": len(train), "share": share, "count": None if counts is None else dict(counts)}


def run_weight_stats(train: Sequence[dict], rows: int) -> dict:
    """Sufficient statistics of a run's per-trajectory weights over its training steps.

    Exact from `trajectories.weight` when recorded. Otherwise from the per-step weight_mean,
    weight_min, weight_max and weight_ess (ess = (sum w)^2 / sum w^2) of `rows` trajectories:
    sums are exact, the count of weights != 1 only bounded (`ne1_low` .. `ne1_high`), and there
    are no values for quantiles.
    """
    if train and all("trajectories" in r for r in train):
        w = np.concatenate([np.asarray(r["trajectories"]["weight"], float) for r in train])
        ne1 = int(np.sum(~np.isclose(w, 1.0)))
        return {
            "rows": int(w.size),
            "sum": float(w.sum()),
            "sum_sq": float(np.sum(w**2)),
            "min": float(w.min()),
            "max": float(w.max()),
            "ne1_low": ne1,
            "ne1_high": ne1,
            "values": w.tolist(),
        }
    out = {
        "rows": 0,
        "sum": 0.0,
        "sum_sq": 0.0,
        "min": math.inf,
        "max": -math.inf,
        "ne1_low": 0,
        "ne1_high": 0,
        "values": None,
    }
    for r in train:
        m = r.get("weights", {})
        if not m or not rows:
            continue
        mean, lo, hi = m["weight_mean"], m["weight_min"], m["weight_max"]
        one_lo, one_hi = math.isclose(lo, 1.0), math.isclose(hi, 1.0)
        if (lo > 1.0 and not one_lo) or (hi < 1.0 and not one_hi):
            low = high = rows  # every weight on one side of 1
        else:
            low, high = (not one_lo) + (not one_hi), rows - one_lo - one_hi
            if one_lo and one_hi:
                low = high = 0
        out["rows"] += rows
        out["sum"] += mean * rows
        out["sum_sq"] += (mean * rows) ** 2 / m["weight_ess"]
        out["min"], out["max"] = min(out["min"], lo), max(out["max"], hi)
        out["ne1_low"] += low
        out["ne1_high"] += high
    return out


def weight_summary(runs: Sequence[dict]) -> dict:
    """An arm's per-trajectory weights over all its runs' training steps: rows, mean, sd
    (ddof 0), min, max, quantiles (None unless recorded) and the share of weights != 1 (a
    [low, high] range when only per-step summaries are recorded)."""
    stats = [r["weights"] for r in runs]
    rows = sum(s["rows"] for s in stats)
    if not rows:
        return {"rows": 0}
    mean = sum(s["sum"] for s in stats) / rows
    values = [s.get("values") for s in stats]  # recorded runs have none
    exact = all(v is not None for v in values)
    quantiles = None
    if exact:
        all_w = np.concatenate([np.asarray(v, float) for v in values])
        quantiles = {
            f"q{round(100 * q):02d}": float(np.quantile(all_w, q)) for q in WEIGHT_QUANTILES
        }
    return {
        "rows": rows,
        "mean": mean,
        "sd": math.sqrt(max(sum(s["sum_sq"] for s in stats) / rows - mean**2, 0.0)),
        "min": min(s["min"] for s in stats),
        "max": max(s["max"] for s in stats),
        "quantiles": quantiles,
        "share_ne1": [
            sum(s["ne1_low"] for s in stats) / rows,
            sum(s["ne1_high"] for s in stats) / rows,
        ],
        "exact": exact,
    }


def acted_on_tags(train: Sequence[dict], config: Mapping) -> set[str]:
    """Tags whose utility differs from 1 at some training step (none with weighting off): the
    tags that move a trajectory's weight away from 1."""
    if not config.get("weighting", {}).get("enabled", True):
        return set()
    out = set()
    for r in train:
        for key, value in r.get("utilities", {}).items():
            if key.startswith("utility/") and not math.isclose(value, 1.0):
                out.add(key.removeprefix("utility/"))
    return out


def category_tag_counts(evals: Sequence[dict], train: Sequence[dict]) -> dict:
    """Tag counts per category: `eval` summed over every evaluation of the run (greedy), and
    `train` from the training records' per-trajectory categories and tags (None unless
    recorded: metrics.jsonl's rollout.tag_fraction pools the categories)."""

    def add(into: dict, category: str, tags: Mapping[str, int]) -> None:
        cat = into.setdefault(category, {})
        for t, n in tags.items():
            cat[t] = cat.get(t, 0) + int(n)

    evaluated: dict[str, dict[str, int]] = {}
    for r in evals:
        for category, tags in r["eval"].get("tag_histogram", {}).items():
            add(evaluated, category, tags)
    trained = None
    if train and all("trajectories" in r for r in train):
        trained = {}
        for r in train:
            for category, tags in zip(r["trajectories"]["category"], r["trajectories"]["tags"]):
                add(trained, category, {t: tags.count(t) for t in set(tags)})
    return {"eval": evaluated, "train": trained}


def category_check(runs: Sequence[dict]) -> dict:
    """Per source (eval, train) and category: [turn tags counted, those the arm's weighting acts
    on], over all runs of an arm; a source some run did not record is left out."""
    out: dict[str, dict[str, list[int]]] = {}
    for source in ("eval", "train"):
        if any(r["category_tags"][source] is None for r in runs):
            continue
        per: dict[str, list[int]] = {}
        for r in runs:
            for category, tags in r["category_tags"][source].items():
                counts = per.setdefault(category, [0, 0])
                counts[0] += sum(tags.values())
                counts[1] += sum(n for t, n in tags.items() if t in r["acted_on"])
        out[source] = per
    return out


# ---- the report ------------------------------------------------------------------------------


def by_seed(runs: Sequence[dict], key: str, column: str) -> dict[int, float]:
    """{seed: run[key][column]} over the runs that have it."""
    return {r["seed"]: r[key][column] for r in runs if r[key] and column in r[key]}


def columns(results: Mapping[str, Sequence[dict]]) -> list[str]:
    """The categories in order of appearance, then "mean"."""
    keys: list[str] = []
    for runs in results.values():
        for r in runs:
            keys += [k for k in r["final"] if k != "mean" and k not in keys]
    return [*keys, "mean"]


def fmt_interval(interval: Sequence[float]) -> str:
    """[lo, hi] in points, or n/a."""
    if any(x is None or math.isnan(x) for x in interval):
        return "n/a"
    return f"[{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]"


def success_table(results: Mapping[str, Sequence[dict]], key: str, keys: list[str]) -> list[str]:
    """Markdown: per arm mean ± sd (ddof 1) over seeds of `key` ("final" or "strict_final")."""
    lines = [
        "| arm | n | " + " | ".join(keys) + " | mean at step 0 | wall s / run |",
        "| --- | ---: |" + " ---: |" * (len(keys) + 2),
    ]
    before = "before" if key == "final" else "strict_before"
    for arm, runs in results.items():
        cells = [arm, str(len(runs))]
        for k in keys:
            values = 100 * np.asarray(list(by_seed(runs, key, k).values()))
            sd = f" ± {values.std(ddof=1):.1f}" if values.size > 1 else ""
            cells.append(f"{values.mean():.1f}{sd}" if values.size else "n/a")
        start = list(by_seed(runs, before, "mean").values())
        cells.append(f"{100 * np.mean(start):.1f}" if start else "n/a")
        cells.append(f"{np.mean([r['wall_s'] for r in runs]):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def paired_tables(results: Mapping[str, Sequence[dict]], keys: list[str], baseline: str) -> dict:
    """{arm: {"official"|"strict": {column: paired_summary vs baseline}}}."""
    base = results.get(baseline)
    if not base:
        return {}
    out = {}
    for arm, runs in results.items():
        if arm == baseline:
            continue
        out[arm] = {
            name: {k: paired_summary(by_seed(runs, key, k), by_seed(base, key, k)) for k in keys}
            for name, key in (("official", "final"), ("strict", "strict_final"))
        }
    return out


def paired_lines(paired: Mapping[str, dict], keys: list[str], baseline: str) -> list[str]:
    """Markdown tables of the paired differences to `baseline` (points): means with both
    intervals, then per category with the t interval."""
    if not paired:
        return [f"No paired differences: {baseline} has no finished run."]
    lines = [
        f"| arm − {baseline} | n | official mean: diff | paired t 95% | bootstrap 95% "
        "| strict mean: diff | paired t 95% | bootstrap 95% |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for arm, p in paired.items():
        cells = [arm, str(p["official"]["mean"]["n"])]
        for name in ("official", "strict"):
            s = p[name]["mean"]
            diff = "n/a" if math.isnan(s["mean"]) else f"{100 * s['mean']:+.1f}"
            cells += [diff, fmt_interval(s["t_interval"]), fmt_interval(s["bootstrap_interval"])]
        lines.append("| " + " | ".join(cells) + " |")
    for name in ("official", "strict"):
        lines += [
            "",
            f"Per category, {name}: mean paired difference [paired t 95%] (points):",
            "",
            f"| arm − {baseline} | " + " | ".join(keys[:-1]) + " |",
            "| --- |" + " ---: |" * (len(keys) - 1),
        ]
        for arm, p in paired.items():
            cells = [
                f"{100 * p[name][k]['mean']:+.1f} {fmt_interval(p[name][k]['t_interval'])}"
                if p[name][k]["n"]
                else "n/a"
                for k in keys[:-1]
            ]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def per_seed_lines(results: Mapping[str, Sequence[dict]]) -> list[str]:
    """Markdown: each arm's official mean final success per seed (step 0 in parentheses)."""
    seeds = sorted({r["seed"] for runs in results.values() for r in runs})
    lines = [
        "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "| --- |" + " ---: |" * len(seeds),
    ]
    for arm, runs in results.items():
        got = {r["seed"]: r for r in runs}
        cells = [
            f"{100 * got[s]['final']['mean']:.1f} ({100 * got[s]['before']['mean']:.1f})"
            if s in got
            else ""
            for s in seeds
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def tag_lines(results: Mapping[str, Sequence[dict]], tags: Mapping[str, dict]) -> list[str]:
    """Markdown: per arm and tag the share of training turn tags (%) and the count."""
    names = sorted(
        {t for s in tags.values() for t in s["share"]},
        key=lambda t: -sum(s["share"].get(t, 0) for s in tags.values()),
    )
    lines = [
        "| arm | steps | " + " | ".join(names) + " |",
        "| --- | ---: |" + " ---: |" * len(names),
    ]
    for arm in results:
        s = tags[arm]
        cells = []
        for t in names:
            count = f" ({s['count'].get(t, 0)})" if s["count"] is not None else ""
            cells.append(f"{100 * s['share'].get(t, 0.0):.1f}{count}")
        lines.append(f"| {arm} | {s['steps']} | " + " | ".join(cells) + " |")
    return lines


def arm_tag_summary(runs: Sequence[dict]) -> dict:
    """An arm's training tags: mean share over its runs, summed counts (None if any is missing)."""
    names = sorted({t for r in runs for t in r["tags"]["share"]})
    share = {t: float(np.mean([r["tags"]["share"].get(t, 0.0) for r in runs])) for t in names}
    counts = None
    if all(r["tags"]["count"] is not None for r in runs):
        counts = {
            t: sum(r["tags"]["count"].get(t, 0) for r in runs)
            for t in sorted({t for r in runs for t in r["tags"]["count"]})
        }
    return {"steps": sum(r["tags"]["steps"] for r in runs), "share": share, "count": counts}


def weight_lines(weights: Mapping[str, dict]) -> list[str]:
    """Markdown: per arm the per-trajectory weight distribution in training."""
    q = [f"q{round(100 * x):02d}" for x in WEIGHT_QUANTILES]
    lines = [
        "| arm | trajectories | mean | sd | min | " + " | ".join(q) + " | max | share != 1 |",
        "| --- |" + " ---: |" * (len(q) + 6),
    ]
    for arm, w in weights.items():
        if not w["rows"]:
            lines.append(f"| {arm} | 0 |" + " |" * (len(q) + 5))
            continue
        quants = [f"{w['quantiles'][k]:.3f}" if w["quantiles"] else "n/r" for k in q]
        lo, hi = w["share_ne1"]
        share = f"{100 * lo:.1f}%" if lo == hi else f"{100 * lo:.1f}-{100 * hi:.1f}%"
        lines.append(
            f"| {arm} | {w['rows']} | {w['mean']:.3f} | {w['sd']:.3f} | {w['min']:.3f} | "
            + " | ".join(quants)
            + f" | {w['max']:.3f} | {share} |"
        )
    return lines


def category_lines(results: Mapping[str, Sequence[dict]], checks: Mapping[str, dict]) -> list[str]:
    """Markdown: per arm with weighting on, the tags it acts on and, per category, the share of
    turn tags that are among them; then the categories where none occurred."""
    lines, never = [], []
    for arm, runs in results.items():
        acted = sorted({t for r in runs for t in r["acted_on"]})
        if not acted:
            lines.append(f"* {arm}: weighting off (or no utility ever != 1): every weight is 1.")
            continue
        for source, per in checks[arm].items():
            cells = [f"{c} {100 * a / max(n, 1):.1f}% ({a}/{n})" for c, (n, a) in per.items()]
            lines.append(
                f"* {arm}, {source} rollouts, acted-on tags ({', '.join(acted)}) per "
                f"category: " + "; ".join(cells)
            )
            never += [f"{arm} ({source}): {c}" for c, (n, a) in per.items() if a == 0]
    lines.append("")
    if never:
        lines.append(
            "**Categories that never produced a tag the weighting acts on:** "
            + "; ".join(never)
            + "."
        )
    else:
        lines.append("Every category produced tags the weighting acts on, in every source shown.")
    return lines


def integrity_lines(results: Mapping[str, Sequence[dict]]) -> list[str]:
    """Warnings: an arm's runs with differing flags, a seed whose arms do not share one warm
    start, arms whose resolved configs are identical on every common seed."""
    out = []
    for arm, runs in results.items():
        flag_sets = {
            json.dumps([a for a in (r["run_args"] or []) if not a.startswith("--config.seed=")])
            for r in runs
        }
        if len(flag_sets) > 1:
            out.append(f"* {arm}: its runs differ in run.py flags: {sorted(flag_sets)}")
    seeds = sorted({r["seed"] for runs in results.values() for r in runs})
    for s in seeds:
        digests = {
            arm: r["warm_start"] for arm, runs in results.items() for r in runs if r["seed"] == s
        }
        if len(set(digests.values())) > 1:
            out.append(f"* seed {s}: the arms start from different warm starts {digests}")
    arms = list(results)
    for i, a in enumerate(arms):
        for b in arms[i + 1 :]:
            ca = {r["seed"]: r["config_digest"] for r in results[a]}
            cb = {r["seed"]: r["config_digest"] for r in results[b]}
            common = set(ca) & set(cb)
            if common and all(ca[s] == cb[s] for s in common):
                out.append(
                    f"* {a} and {b} have the same resolved config (run config.json) on "
                    f"every common seed: the same runs twice."
                )
    return out


def plot_success(results: Mapping[str, Sequence[dict]], keys: list[str], path: str) -> None:
    """Grouped bars: official final success per category and mean per arm, +- sd (ddof 1)."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(keys) + 2), 4.2))
    width = 0.8 / max(1, len(results))
    x = np.arange(len(keys))
    for i, (arm, runs) in enumerate(results.items()):
        values = 100 * np.asarray([[r["final"][k] for k in keys] for r in runs])
        sd = values.std(0, ddof=1) if len(runs) > 1 else None
        ax.bar(
            x + (i - (len(results) - 1) / 2) * width,
            values.mean(0),
            width,
            yerr=sd,
            capsize=2,
            label=f"{arm} (n={len(runs)})",
        )
    before = np.mean([100 * r["before"]["mean"] for runs in results.values() for r in runs])
    ax.axhline(before, color="black", linestyle="--", linewidth=1, label="warm start (mean)")
    ax.set_xticks(x, keys)
    ax.set_ylabel("final evaluation success (%), official")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_paired(paired: Mapping[str, dict], path: str, baseline: str) -> None:
    """Per arm each seed's difference to `baseline` (dots), the mean, the paired t interval and
    the bootstrap interval; official and strict mean side by side."""
    fig, axes = plt.subplots(1, 2, figsize=(max(7.0, 2.4 * len(paired) + 2), 4.2))
    for ax, name in zip(axes, ("official", "strict")):
        for i, p in enumerate(paired.values()):
            s = p[name]["mean"]
            d = 100 * np.asarray(s["diffs"])
            jitter = np.linspace(-0.12, 0.12, len(d)) if len(d) > 1 else np.zeros(len(d))
            ax.scatter(i - 0.15 + jitter, d, s=14, color="gray", label="seed" if i == 0 else None)
            if not s["n"]:
                continue
            for dx, key, color, label in (
                (0.1, "t_interval", "C0", "paired t 95%"),
                (0.25, "bootstrap_interval", "C1", "bootstrap 95%"),
            ):
                lo, hi = s[key]
                if not math.isnan(lo):
                    ax.errorbar(
                        i + dx,
                        100 * s["mean"],
                        yerr=[[100 * (s["mean"] - lo)], [100 * (hi - s["mean"])]],
                        fmt="none",
                        color=color,
                        capsize=4,
                        label=label if i == 0 else None,
                    )
            ax.plot(
                i + 0.175, 100 * s["mean"], "k_", markersize=14, label="mean" if i == 0 else None
            )
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(
            range(len(paired)),
            [f"{a}\nn={p[name]['mean']['n']}" for a, p in paired.items()],
            fontsize=7,
        )
        ax.set_ylabel(f"{name} mean final success − {baseline} (points)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def clean(value: object) -> object:
    """A JSON-able copy: NaN -> None, numpy scalars -> Python numbers."""
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def run_flags(runs: Sequence[dict]) -> str:
    """The run.py flags of an arm's first run, its seed left out (run_args.json)."""
    args = runs[0]["run_args"]
    if args is None:
        return "(not recorded)"
    return " ".join(a for a in args if not a.startswith("--config.seed="))


def protocol_lines(config: str, baseline: str) -> list[str]:
    """The protocol fixed before running, as the report states it."""
    return [
        f"Config `{config}`. Protocol: every arm of a seed starts RL from the same warm start, "
        "built by the first arm of `warm_start_order` on the plain view and the views its "
        "training shows; primary metric: the official mean final evaluation success; "
        "secondary: the strict mean (BFCL's irrelevance check too) and the categories. Paired "
        f"differences are arm − {baseline} on the same seed; intervals: "
        f"{100 * CONFIDENCE:.0f}% paired t (t "
        "quantile with n − 1 degrees of freedom, sd ddof 1) and percentile bootstrap over seeds "
        f"({BOOTSTRAP_RESAMPLES} resamples, RNG seed {BOOTSTRAP_SEED}). Means ± sd over seeds "
        "use ddof 1.",
    ]


def found_lines(results: Mapping[str, Sequence[dict]], arms: Sequence[str]) -> list[str]:
    """Markdown: per arm the finished runs found, their seeds, those of them taken from
    --recorded files, and the run.py flags."""
    lines = [
        "| arm | n | seeds | of them recorded | run.py flags (first run) |",
        "| --- | ---: | --- | --- | --- |",
    ]
    for arm in arms:
        runs = results.get(arm, [])
        seeds = ", ".join(str(r["seed"]) for r in runs)
        recorded = ", ".join(str(r["seed"]) for r in runs if r.get("recorded"))
        lines.append(
            f"| {arm} | {len(runs)} | {seeds} | {recorded} | `{run_flags(runs)}` |"
            if runs
            else f"| {arm} | 0 | | | |"
        )
    return lines


def write_report(
    out_dir: str,
    root: str,
    arms: Sequence[str],
    config: str,
    recorded: Mapping[str, Mapping[int, dict]] | None = None,
    baseline: str = BASELINE,
) -> str:
    """Reads the finished runs of `arms` under `root` and the `recorded` ones (`collect`) and
    writes results.md, results.json, comparison.png and paired_differences.png (every other arm
    against `baseline`, seed by seed) into `out_dir`; returns results.md's text."""
    os.makedirs(out_dir, exist_ok=True)
    results = collect(root, arms, recorded)
    head = [
        "# SEAL versus the baselines on the generated suite",
        "",
        *protocol_lines(config, baseline),
        "",
        "Finished runs found:",
        "",
        *found_lines(results, arms),
    ]
    if not results:
        text = "\n".join([*head, "", "No finished run yet.", ""])
        with open(os.path.join(out_dir, "results.md"), "w") as f:
            f.write(text)
        return text
    keys = columns(results)
    paired = paired_tables(results, keys, baseline)
    tags = {arm: arm_tag_summary(runs) for arm, runs in results.items()}
    weights = {arm: weight_summary(runs) for arm, runs in results.items()}
    checks = {arm: category_check(runs) for arm, runs in results.items()}
    plot_success(results, keys, os.path.join(out_dir, "comparison.png"))
    if paired:
        plot_paired(paired, os.path.join(out_dir, "paired_differences.png"), baseline)
    warnings = integrity_lines(results)
    text = [
        *head,
        "",
        *(["Checks:", "", *warnings, ""] if warnings else []),
        "## Final evaluation success (%), official",
        "",
        *success_table(results, "final", keys),
        "",
        "## Final evaluation success (%), strict",
        "",
        *success_table(results, "strict_final", keys),
        "",
        "Per seed, official mean final (step 0):",
        "",
        *per_seed_lines(results),
        "",
        f"## Paired differences to {baseline} (same seed, points)",
        "",
        *paired_lines(paired, keys, baseline),
        "",
        *(["![paired differences](paired_differences.png)", ""] if paired else []),
        "![comparison](comparison.png)",
        "",
        "## Diagnosis tags in training rollouts",
        "",
        "Share of the turn tags of a training step (%), mean over steps and runs; in parentheses "
        "the count over all runs (the final checkpoint's all-time totals).",
        "",
        *tag_lines(results, tags),
        "",
        "## Per-trajectory weights in training",
        "",
        "Over every training trajectory of every run. n/r: some run has no per-trajectory "
        "weights (a --recorded run keeps only their sums; a metrics.jsonl without trajectory "
        "records keeps per step only weight_mean/min/max/ess): mean, sd, min and max stay "
        "exact, the share of weights != 1 is a range when only per-step summaries exist.",
        "",
        *weight_lines(weights),
        "",
        "## Tags the weighting acts on, per category",
        "",
        "Acted-on tags: utility != 1 at some training step of the run. eval: every evaluation of "
        "the run (greedy, steps 0 to final); train: training rollouts, only when metrics.jsonl "
        "records per-trajectory categories (rollout.tag_fraction pools the categories).",
        "",
        *category_lines(results, checks),
        "",
    ]
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(text))
    for runs in results.values():
        for r in runs:
            r["weights"] = {k: v for k, v in r["weights"].items() if k != "values"}
    summary = {
        "config": config,
        "arms": {a: ARMS[a] for a in arms},
        "baseline": baseline,
        "confidence": CONFIDENCE,
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED},
        "checks": warnings,
        "paired": paired,
        "tags": tags,
        "weights": weights,
        "categories": checks,
        "runs": results,
    }
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(clean(summary), f, indent=1)
    return "\n".join(text)


def main(argv: list[str]) -> None:
    """Runs every arm x seed (unless --report_only), then writes the report."""
    del argv
    unknown = [a for a in FLAGS.arms if a not in ARMS]
    if unknown:
        raise app.UsageError(f"unknown arms {unknown}; use some of {', '.join(ARMS)}")
    chosen = FLAGS["baseline"].present or FLAGS.baseline != BASELINE  # the default may be absent
    if chosen and FLAGS.baseline not in FLAGS.arms:
        raise app.UsageError(f"--baseline={FLAGS.baseline} is not one of --arms={FLAGS.arms}")
    if not FLAGS.reuse:
        FLAGS.rerun = True
    out_dir = os.path.abspath(FLAGS.out_dir)
    root = os.path.abspath(FLAGS.workdir_root or os.path.join(out_dir, "runs"))
    failed = []
    recorded = read_recorded(FLAGS.recorded, FLAGS.arms)
    if not FLAGS.report_only:
        os.makedirs(root, exist_ok=True)
        seeds = range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds)
        failed = run_study(root, FLAGS.arms, seeds, recorded)
    print(write_report(out_dir, root, FLAGS.arms, FLAGS.config, recorded, FLAGS.baseline))
    if failed:
        sys.exit(f"failed runs (rerun to retry): {', '.join(failed)}")


if __name__ == "__main__":
    app.run(main)

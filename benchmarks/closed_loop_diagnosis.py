"""Why the closed-loop interface collapses the CPU default's policy (issue 38).

    python -m benchmarks.closed_loop_diagnosis
        [--run=workdirs/seal_vs_baselines_study/runs/closed_loop_seed0]
        [--plain_run=workdirs/seal_vs_baselines_study/runs/seal_seed0]
        [--out_dir=workdirs/closed_loop_diagnosis] [--tasks=200] [--split=train]

Reads a finished closed-loop run of configs/tiny.py (its metrics.jsonl and warm start) and a
plain-interface run of the same seed and warm start, and writes `results.md` and
`results.json` to --out_dir:

1. The loop's trajectory: per training step, the units the interface showed (the state after
   the previous step's update), the training reward beside the plain run's at the same step,
   the rollouts that hit the context limit, and how often each component's units switched on
   and off.
2. What the text costs: tokens per character of each component's text under the policy's
   tokenizer against the suite's own task text, and the prompt lengths of the tasks' openings
   under each view against the room the context leaves for replies.
3. What the warm start does with it: the warm-start policy, greedy, on --tasks tasks of
   --split (round-robin over categories) under each view: the plain interface, each component
   static on its own (every unit), all four, and the loop's own state at the step its training
   reward was lowest. Success (official), tags, tool calls and format errors per view: this
   isolates what each component's text does to the policy before RL has changed it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configs import tiny  # noqa: E402
from environments.interface import (  # noqa: E402
    AFFORDANCE_CUE,
    COMPONENTS,
    GUIDELINES,
    HINTS,
    INSTRUCTION,
    InterfaceRenderer,
)
from environments.rendering import Renderer  # noqa: E402
from environments.summary import summarize  # noqa: E402

FLAGS = flags.FLAGS
STUDY = "workdirs/seal_vs_baselines_study/runs"


def define_flags() -> None:
    """The command's flags, defined when it runs (not on import: the tests import this module
    beside seal_vs_baselines, whose --out_dir would clash)."""
    flags.DEFINE_string("run", f"{STUDY}/closed_loop_seed0", "A finished closed-loop run.")
    flags.DEFINE_string(
        "plain_run", f"{STUDY}/seal_seed0", "The plain-interface run beside it ('': none)."
    )
    flags.DEFINE_string("out_dir", "workdirs/closed_loop_diagnosis", "results.md, results.json.")
    flags.DEFINE_integer("tasks", 200, "Tasks per view in the warm-start probe (0: the split).")
    flags.DEFINE_enum("split", "train", ["train", "eval"], "The probe's tasks.")


# ---- 1. the trajectory -------------------------------------------------------------------------


def read_records(run: str) -> list[dict]:
    """A run's metrics.jsonl records (ValueError without one)."""
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"{path} not found: --run and --plain_run must be run.py work dirs")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def training(records: Sequence[dict]) -> dict[int, dict]:
    """Step -> the training record of that step."""
    return {r["step"]: r for r in records if "rollout" in r}


def trajectory(loop: Sequence[dict], plain: Sequence[dict]) -> dict:
    """Per step: units shown, rewards of both runs, context-limit fraction; and switch counts
    (off -> on, on -> off) per component."""
    steps, plain_steps = training(loop), training(plain)
    shown = {c: [] for c in COMPONENTS}  # the state before step 1 is empty
    rows, switches = [], {c: collections.Counter() for c in COMPONENTS}
    for step in sorted(steps):
        record = steps[step]
        after = record["interface"]["active"]
        rows.append(
            {
                "step": step,
                "shown": {c: list(shown[c]) for c in COMPONENTS},
                "reward": record["rollout"]["reward_mean"],
                "plain_reward": plain_steps.get(step, {}).get("rollout", {}).get("reward_mean"),
                "context_limit_fraction": record["rollout"]["context_limit_fraction"],
                "tag_fraction": record["rollout"]["tag_fraction"],
                "plain_tag_fraction": plain_steps.get(step, {})
                .get("rollout", {})
                .get("tag_fraction", {}),
            }
        )
        for c in COMPONENTS:
            before, now = set(shown[c]), set(after[c])
            switches[c]["on"] += len(now - before)
            switches[c]["off"] += len(before - now)
        shown = after
    return {"steps": rows, "switches": {c: dict(s) for c, s in switches.items()}}


# ---- 2. what the text costs --------------------------------------------------------------------


def chars_per_token(tokenizer, texts: Sequence[str]) -> float:
    """Characters per token of `texts` under `tokenizer` (higher: the text is familiar)."""
    chars = sum(len(t) for t in texts)
    tokens = sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts)
    return chars / max(tokens, 1)


def component_texts() -> dict[str, list[str]]:
    """The fixed text each component adds (hints with placeholders filled by a sample)."""
    sample = {"tools": "list_files, read_file", "tool": "read_file", "argument": "path"}
    sample["expected"] = "string"
    return {
        "schema_cues": [INSTRUCTION, "[required] Allowed values: a, b."],
        "affordance_cues": [AFFORDANCE_CUE],
        "error_hints": ["Hint: " + h.format(**sample) for h in HINTS.values()],
        "guidelines": ["Guidelines:"] + [f"- {line}" for line in GUIDELINES.values()],
    }


# ---- 3. the warm-start probe -------------------------------------------------------------------


def views(
    lowest_state: Mapping[str, Sequence[str]] | None,
) -> dict[str, InterfaceRenderer | Renderer]:
    """The interfaces probed: plain, each component static alone, all four, and the loop's
    state at its lowest training reward (unless None: a run with no training step yet)."""
    off = dict.fromkeys(COMPONENTS, "off")
    none = {c: () for c in COMPONENTS}
    out: dict[str, InterfaceRenderer | Renderer] = {"plain": Renderer(prompt_style="chat_template")}
    for c in COMPONENTS:
        out[c] = InterfaceRenderer({**off, c: "static"}, none, prompt_style="chat_template")
    out["all four"] = InterfaceRenderer(
        dict.fromkeys(COMPONENTS, "static"), none, prompt_style="chat_template"
    )
    if lowest_state is None:
        return out
    out["loop state at its lowest reward"] = InterfaceRenderer(
        dict.fromkeys(COMPONENTS, "adaptive"),
        {c: tuple(lowest_state[c]) for c in COMPONENTS},
        prompt_style="chat_template",
    )
    return out


def probe_config(run: str):
    """configs/tiny.py's config of the run (its variant and seed, from run_args.json)."""
    with open(os.path.join(run, "run_args.json")) as f:
        args = json.load(f)
    variant, seed = "seal", 0
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "--config" and value.startswith("configs/tiny.py"):
            variant = value.partition(":")[2] or "seal"
        elif key == "--config.seed":
            seed = int(value)
        else:
            raise ValueError(f"{run}: run.py flag {arg!r} is not one this probe rebuilds")
    config = tiny.get_config(variant)
    config.seed = seed
    return config


def prompt_lengths(built, config, view, ids: Sequence[str]) -> list[int]:
    """Prompt tokens of each task's opening under `view`, as the episode driver renders it."""
    from seal_jax import episodes

    view = dataclasses.replace(view, tool_format=built.chat.tool_format)
    with episodes.open_pool(built.source, config.env, config.env.train_mode) as pool:
        openings = pool.reset(list(ids), view)
    return [len(built.chat.prompt_ids(opening)) for opening in openings]


def probe(
    run: str, lowest_state: Mapping[str, Sequence[str]] | None, split: str, limit: int
) -> dict:
    """The warm start, greedy, on the probe's tasks under each view (module docstring, 3). A
    task whose prompt leaves no room for a reply counts as a failure (as in training, where
    such an episode ends at once with reward 0)."""
    from seal_jax import episodes, evaluation, trainer
    from seal_jax.modes import load_policy

    config = probe_config(run)
    model = load_policy(config, os.path.join(run, "warm_start"))
    built = trainer.build(config, model, run)
    ids = evaluation.eval_task_ids(built.source, limit, split)
    room = config.rollout.context_limit - config.train.eval_max_new_tokens
    out = {}
    for name, view in views(lowest_state).items():
        lengths = np.array(prompt_lengths(built, config, view, ids))
        fit = [i for i, n in zip(ids, lengths) if n <= room]
        category_of = built.source.category_of
        with episodes.open_pool(built.source, config.env, config.env.train_mode) as pool:
            batch = episodes.collect_episodes(
                built.eval_engine,
                model.params,
                built.chat,
                pool,
                task_ids=fit,
                num_samples=1,
                seed=0,
                chunk_tasks=config.train.eval_batch_tasks,
                slots=config.rollout.slots,
                renderer=view,
            )
        summary = summarize(batch.results, built.source.categories)
        # Per category over all its tasks: a prompt too long fails.
        category = [built.source.category_of(i) for i in ids]
        total, fits = collections.Counter(category), collections.Counter(map(category_of, fit))
        accuracy = {
            c: summary["accuracy"].get(c, 0.0) * fits[c] / total[c]
            for c in built.source.categories
            if total[c]
        }
        out[name] = {
            "mean": float(np.mean(list(accuracy.values()))),
            "accuracy": accuracy,
            "tags": summary["tags"],
            "calls_per_episode": float(np.mean([r.model_calls for r in batch.results])),
            "context_limit_fraction": float(
                np.mean([s.stop_reason == "context_limit" for s in batch.sequences])
            ),
            "prompt_tokens": {
                "mean": float(lengths.mean()),
                "max": int(lengths.max()),
                "room": room,
            },
            "prompts_too_long": len(ids) - len(fit),
        }
        print(
            f"{name}: mean {out[name]['mean']:.3f} prompt tokens {lengths.mean():.0f}", flush=True
        )
    plain_text = [r.transcript[0]["content"] for r in batch.results[:20]]
    tokenizer = built.chat.tokenizer
    return {
        "views": out,
        "chars_per_token": {
            "suite task text (system prompts)": chars_per_token(tokenizer, plain_text),
            **{c: chars_per_token(tokenizer, t) for c, t in component_texts().items()},
        },
        "tasks": len(ids),
        "split": split,
    }


# ---- the report --------------------------------------------------------------------------------


def lowest_reward_state(loop: Sequence[dict]) -> tuple[int | None, dict | None]:
    """The step whose training reward was lowest and the interface state it was shown, or
    (None, None) before the first training step (the probe then runs without that view)."""
    rows = trajectory(loop, [])["steps"]
    if not rows:
        return None, None
    low = min(rows, key=lambda r: (r["reward"], r["step"]))
    return low["step"], low["shown"]


def fmt(value: float | None, digits: int = 2) -> str:
    """A number with `digits` decimals, or "" for None."""
    return "" if value is None else f"{value:.{digits}f}"


def trajectory_lines(traj: Mapping) -> list[str]:
    """Markdown: the loop's trajectory table and switch counts."""
    out = [
        "| step | schema | affordance | hints | guidelines | reward (loop) | reward (plain) "
        "| context limit | spurious (loop / plain) | abstention (loop / plain) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in traj["steps"]:
        shown = [str(len(r["shown"][c])) for c in COMPONENTS]
        tags = [
            f"{fmt(r['tag_fraction'].get(t, 0.0))} / {fmt(r['plain_tag_fraction'].get(t, 0.0))}"
            for t in ("spurious_tool_call", "correct_abstention")
        ]
        out.append(
            f"| {r['step']} | {' | '.join(shown)} | {fmt(r['reward'])} | "
            f"{fmt(r['plain_reward'])} | {fmt(r['context_limit_fraction'])} | {' | '.join(tags)} |"
        )
    out += ["", "Units switched on / off over the run:", ""]
    out += [
        f"* {c}: {s.get('on', 0)} on, {s.get('off', 0)} off" for c, s in traj["switches"].items()
    ]
    return out


def probe_lines(result: Mapping) -> list[str]:
    """Markdown: the warm-start probe's table and the tokenizer figures."""
    cats = list(next(iter(result["views"].values()))["accuracy"])
    out = [
        f"| view | mean | {' | '.join(cats)} | calls / episode | context limit | "
        "prompt tokens mean / max (room) | prompts too long | top tags |",
        "| --- | ---: | "
        + " | ".join("---:" for _ in cats)
        + " | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, v in result["views"].items():
        acc = " | ".join(fmt(100 * v["accuracy"][c], 1) for c in cats)
        tags = sorted(v["tags"].items(), key=lambda kv: -kv[1])[:4]
        p = v["prompt_tokens"]
        out.append(
            f"| {name} | {100 * v['mean']:.1f} | {acc} | {v['calls_per_episode']:.2f} | "
            f"{fmt(v['context_limit_fraction'])} | {p['mean']:.0f} / {p['max']} ({p['room']}) | "
            f"{v['prompts_too_long']} | " + ", ".join(f"{t} {n}" for t, n in tags) + " |"
        )
    out += ["", "Characters per token under the policy's tokenizer (higher: familiar text):", ""]
    out += [f"* {name}: {cpt:.2f}" for name, cpt in result["chars_per_token"].items()]
    return out


def main(argv: list[str]) -> None:
    """Writes the diagnosis (module docstring) to --out_dir and prints it."""
    del argv
    try:
        loop = read_records(FLAGS.run)
        plain = read_records(FLAGS.plain_run) if FLAGS.plain_run else []
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    traj = trajectory(loop, plain)
    step, state = lowest_reward_state(loop)
    result = probe(FLAGS.run, state, FLAGS.split, FLAGS.tasks)
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    first_cued = next(
        (r["step"] for r in traj["steps"] if any(r["shown"][c] for c in COMPONENTS[:3])), None
    )
    data = {
        "run": FLAGS.run,
        "plain_run": FLAGS.plain_run,
        "trajectory": traj,
        "lowest_reward_step": step,
        "first_step_with_cues": first_cued,
        "probe": result,
    }
    with open(os.path.join(FLAGS.out_dir, "results.json"), "w") as f:
        json.dump(data, f, indent=1)
    lines = [
        "# Why the closed loop collapses",
        "",
        f"Run `{FLAGS.run}` against `{FLAGS.plain_run}` (same seed and warm start). "
        f"Command: `python -m benchmarks.closed_loop_diagnosis --run={FLAGS.run} "
        f"--plain_run={FLAGS.plain_run} --tasks={FLAGS.tasks} --split={FLAGS.split}`.",
        "",
        "## The loop's trajectory (units shown at each step: the state after the previous one)",
        "",
        *trajectory_lines(traj),
        "",
        "No training step yet."
        if state is None
        else f"Lowest training reward at step {step}; shown then: "
        + "; ".join(f"{c} {list(state[c])}" for c in COMPONENTS),
        "",
        f"## The warm start under each view ({result['tasks']} {result['split']} tasks, greedy)",
        "",
        *probe_lines(result),
        "",
    ]
    with open(os.path.join(FLAGS.out_dir, "results.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    define_flags()
    app.run(main)

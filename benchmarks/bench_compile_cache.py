"""What the persistent compilation cache saves: the same run.py job twice, cold then warm cache.

    python -m benchmarks.bench_compile_cache [--config=configs/tiny.py]
        [--override=--config.train.max_steps=8 ...]

Both runs use fresh work directories and one new, empty cache directory
(`--config.compilation_cache_dir`): the first compiles every program and saves it, the second
loads them. Prints each run's wall time, the cache's size, and whether the two runs logged the
same metrics (they must: a loaded program is the compiled one). Without overrides the job is
the CPU default, `make demo` (about 10 minutes per run on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_string("config", "configs/tiny.py", "Config file of the job.")
flags.DEFINE_multi_string("override", [], "Extra run.py flags, applied to both runs.")
FLAGS = flags.FLAGS


def _results(workdir: str) -> list[tuple]:
    """Per logged step: the evaluation (without its duration), the rollouts' and the loss's
    metrics; the timing fields differ between runs by design."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [
        (
            row["step"],
            {k: v for k, v in row.get("eval", {}).items() if k != "seconds"},
            row.get("rollout"),
            row.get("loss"),
        )
        for row in rows
    ]


def _timed_run(workdir: str, cache: str) -> float:
    """Runs the job in `workdir` with `cache`; returns its wall time in seconds."""
    cmd = [
        sys.executable,
        "run.py",
        f"--config={FLAGS.config}",
        f"--workdir={workdir}",
        f"--config.compilation_cache_dir={cache}",
        *FLAGS.override,
    ]
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    """Runs the job cold and warm and prints the comparison."""
    del argv
    with tempfile.TemporaryDirectory(prefix="bench_compile_cache_") as tmp:
        cache = os.path.join(tmp, "xla")
        cold = _timed_run(os.path.join(tmp, "cold"), cache)
        files = os.listdir(cache)
        size = sum(os.path.getsize(os.path.join(cache, f)) for f in files)
        warm = _timed_run(os.path.join(tmp, "warm"), cache)
        same = _results(os.path.join(tmp, "cold")) == _results(os.path.join(tmp, "warm"))
    print(f"job: {FLAGS.config} {' '.join(FLAGS.override)}")
    print(f"cold cache: {cold:7.1f} s  ({len(files)} programs saved, {size / 2**20:.1f} MiB)")
    print(f"warm cache: {warm:7.1f} s  ({cold / warm:.2f}x faster, {cold - warm:.0f} s saved)")
    print(f"same metrics in both runs: {same}")


if __name__ == "__main__":
    app.run(main)

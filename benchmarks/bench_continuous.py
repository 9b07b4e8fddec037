"""Continuous batching against lockstep turns, on long-tailed and uniform multi-turn workloads.

Each workload is E episodes (G rows per prompt, 64-token prompts) of several turns; every
reply's length and every observation's length is drawn per (episode, turn) from the workload's
distribution (the stop id is out of reach, so a reply is exactly its budget):
  * long-tailed: 85% of replies 8 tokens, 15% 160; observations 90% 16 tokens, 10% 256; 1-4
    turns per episode.
  * uniform: every reply 32 tokens, every observation 32 tokens, 3 turns.
The environment answers in this process, at once for lockstep and during the next decode round
for continuous batching (the episode driver's schedule): the figures are the device schedule
alone (a real environment's latency adds to lockstep's turn barrier, not to the stream's).
  * lockstep: `RolloutEngine.start` over chunks of S rows; each turn waits for its longest reply.
  * continuous: `seal_jax.continuous.ContinuousRollout` with S slots, every episode queued.
Both hold S rows in their caches (equal memory, up to the cache lengths, which are measured:
peak bytes of the device arrays beyond the parameters, sampled at every device call of an
untimed first run that also compiles every shape); times are medians of --repeats runs of each,
alternated. Random weights, float32, one device.

    python -m benchmarks.bench_continuous                        # tiny policy, both workloads
    python -m benchmarks.bench_continuous --shape=qwen2.5-0.5b --episodes=32 --slots=8
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import numpy as np

from benchmarks.bench_multiturn import SHAPES, model_config
from seal_jax.continuous import ContinuousRollout
from seal_jax.models import init_params
from seal_jax.rollout import EngineConfig, RolloutEngine
from seal_jax.sampler import SamplingParams
from seal_jax.sharding import single_device_mesh

WORKLOADS = {  # (reply lengths, their odds), (observation lengths, odds), turns
    "long-tailed": (((8, 160), (0.85, 0.15)), ((16, 256), (0.9, 0.1)), (1, 2, 3, 4)),
    "uniform": (((32,), (1.0,)), ((32,), (1.0,)), (3,)),
}


def workload(name: str, episodes: int, vocab: int, seed: int = 0) -> list[dict]:
    """Per episode: its prompt, its replies' budgets and the observations that follow them."""
    (reply, p_reply), (obs, p_obs), turns = WORKLOADS[name]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(episodes):
        n = int(rng.choice(turns))
        out.append(
            {
                "prompt": rng.integers(0, vocab - 1, 64).tolist(),
                "budgets": rng.choice(reply, n, p=p_reply).tolist(),
                "observations": [
                    rng.integers(0, vocab - 1, int(k)).tolist()
                    for k in rng.choice(obs, n - 1, p=p_obs)
                ],
            }
        )
    return out


def run_lockstep(engine, params, episodes: list[dict], slots: int, group: int) -> int:
    """Chunks of `slots` rows, turn by turn; returns the tokens sampled."""
    sampled = 0
    for start in range(0, len(episodes), slots):
        chunk = episodes[start : start + slots]
        prompts = [e["prompt"] for e in chunk[::group]]
        rollout = engine.start(params, prompts, num_samples=group, seed=start)
        turns = rollout.generate(max_new_tokens={r: e["budgets"][0] for r, e in enumerate(chunk)})
        t = 0
        while True:
            sampled += sum(len(turn.ids) for turn in turns.values())
            t += 1
            live = [r for r in turns if len(chunk[r]["budgets"]) > t]
            if not live:
                break
            env = {r: chunk[r]["observations"][t - 1] for r in live}
            turns = rollout.generate(env, max_new_tokens={r: chunk[r]["budgets"][t] for r in live})
    return sampled


def run_continuous(engine, params, episodes: list[dict], slots: int, group: int) -> int:
    """Every episode streamed through `slots` slots, with the episode driver's schedule
    (`seal_jax.episodes.stream_episodes`): the turns that end in one round are answered while
    the next round decodes and continue in the round after. Returns the tokens sampled."""
    stream = ContinuousRollout(engine, params, slots=slots, seed=0)
    for start in range(0, len(episodes), group):
        rows = range(start, min(start + group, len(episodes)))
        first = {r: episodes[r]["budgets"][0] for r in rows}
        stream.add(episodes[start]["prompt"], rows, max_new_tokens=first)
    done, sampled, answered = dict.fromkeys(range(len(episodes)), 0), 0, []
    while stream.busy:
        turns = stream.step() if stream.decoding else {}
        for r in answered:
            e = episodes[r]
            if done[r] == len(e["budgets"]):
                stream.finish(r)
            else:
                stream.extend(r, e["observations"][done[r] - 1], e["budgets"][done[r]])
        for r, turn in turns.items():
            sampled += len(turn.ids)
            done[r] += 1
        answered = sorted(turns)
    return sampled


def peak_bytes(engine, run) -> int:
    """Peak bytes of live device arrays beyond those alive before `run` (the parameters),
    sampled at every device call of `run()`."""
    before = sum(x.nbytes for x in jax.live_arrays())
    peak, call = [0], engine.call

    def tracked(*args):
        out = call(*args)
        peak[0] = max(peak[0], sum(x.nbytes for x in jax.live_arrays()) - before)
        return out

    engine.call = tracked
    try:
        run()
    finally:
        engine.call = call
    return peak[0]


def main() -> None:
    """Prints episodes per second, tokens per second and peak cache memory of both schedules."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", choices=list(SHAPES))
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--group", type=int, default=4, help="rows per prompt (G)")
    parser.add_argument("--workloads", default="long-tailed,uniform")
    parser.add_argument("--decode_segment", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each (median)")
    args = parser.parse_args()
    cfg = model_config(args.shape)
    params = init_params(cfg, jax.random.key(0))
    mesh = single_device_mesh()
    params = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    settings = EngineConfig(
        context_limit=2048,
        max_new_tokens=160,
        stop_ids=(cfg.vocab_size,),  # out of reach: every reply runs its budget
        sampling=SamplingParams("sample"),
        decode_segment=args.decode_segment,
        min_batch=4,
        min_prefill_width=16,
        min_cache_len=128,
    )
    engine = RolloutEngine(cfg, mesh, settings)
    print(
        f"{args.shape}: {args.episodes} episodes, {args.slots} rows in the cache, "
        f"G={args.group}, decode segments of {args.decode_segment}"
    )
    print(
        f"{'workload':>12} {'schedule':>10} {'episodes/s':>10} {'tokens/s':>9} "
        f"{'peak MiB':>8} {'speed-up':>8}"
    )
    for name in args.workloads.split(","):
        episodes = workload(name, args.episodes, cfg.vocab_size)
        runs = {
            schedule: functools.partial(run, engine, params, episodes, args.slots, args.group)
            for schedule, run in (("lockstep", run_lockstep), ("continuous", run_continuous))
        }
        peaks = {schedule: peak_bytes(engine, go) for schedule, go in runs.items()}  # compiles
        times = {schedule: [] for schedule in runs}
        for _ in range(args.repeats):  # alternated, so that load changes hit both alike
            for schedule, go in runs.items():
                start = time.perf_counter()
                tokens = go()
                times[schedule].append(time.perf_counter() - start)
        rates = {s: len(episodes) / float(np.median(t)) for s, t in times.items()}
        for schedule in runs:
            seconds = float(np.median(times[schedule]))
            print(
                f"{name:>12} {schedule:>10} {rates[schedule]:>10.2f} {tokens / seconds:>9.0f} "
                f"{peaks[schedule] / 2**20:>8.1f} {rates[schedule] / rates['lockstep']:>7.2f}x"
            )


if __name__ == "__main__":
    main()

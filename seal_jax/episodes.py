"""The episode driver: runs batches of multi-turn episodes on the rollout engine and the pool.

For a batch of tasks, G rollouts each: the pool opens every episode (system prompt with tools,
first user turn, rendered by the current interface); the prompts are tokenized once per task and
the engine generates every row's reply; each reply's text goes to the pool, which executes its
tool calls and answers with observation messages; those are tokenized with the chat template's
separators and appended to the live rows, which continue from their KV cache. Rows whose episode
is done, that exhaust the model-call budget or hit the context limit stop (and stop costing
device time). At the end the pool verifies and diagnoses every episode.

Two schedules give the same episodes: `generate_episodes` runs every live row's turn together
(lockstep: a turn waits for its longest reply, the pool for the whole batch);
`stream_episodes` streams the episodes through a fixed number of decode slots (continuous
batching, `seal_jax.continuous`), each reply going to the asynchronous pool as soon as it ends.

With several hosts (`collect_episodes`), each runs its contiguous share of the tasks on its own
devices and pool, and every host then holds the whole batch (so all take the same host-side
decisions).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from environments.episode import EpisodeConfig, EpisodeResult
from environments.pool import FAULTS, EnvPool, PoolConfig, fault_kind
from environments.rendering import Renderer
from environments.sources import TaskSource
from seal_jax import continuous, distributed, preemption, trajectories
from seal_jax import rollout as rollout_lib
from seal_jax.chat import ChatFormat


@dataclasses.dataclass
class EpisodeBatch:
    """B*G episodes: row r is the r-th rollout (rows of one task are consecutive).

    Attributes:
      sequences: per row, the engine's token sequence (ids, loss mask, log-probs, stop reason).
      results: per row, the pool's verdict (task, reward, tags, causes, transcript).
      timings: seconds spent in generation and in the environment.
    """

    sequences: list[rollout_lib.TokenSequence]
    results: list[EpisodeResult]
    timings: dict[str, float]


def _task_opening(openings: Sequence[list], task_id: str) -> list:
    """The opening of a task's first row that started (rows whose worker was lost have none)."""
    for opening in openings:
        if opening:
            return opening
    raise RuntimeError(
        f"task {task_id}: none of its episodes could start (environment workers lost)"
    )


def _reply_text(chat: ChatFormat, ids: Sequence[int]) -> str:
    """The assistant message text of a sampled reply (without its end-of-turn token)."""
    ids = list(ids)
    if chat.turn_closed(ids):
        ids = ids[:-1]
    return chat.tokenizer.decode(ids, skip_special_tokens=False)


def _open_episodes(
    engine: Any,
    chat: ChatFormat,
    pool: EnvPool,
    task_ids: Sequence[str],
    num_samples: int,
    renderer: Any,
) -> list[list[int]]:
    """Opens `num_samples` episodes of every task in the pool; returns each task's prompt ids.

    Raises:
      ValueError: a prompt leaves no room for a reply in the context.
    """
    rows = [t for t in task_ids for _ in range(num_samples)]
    # The policy's chat format decides how tools are listed and calls parsed.
    renderer = dataclasses.replace(renderer or Renderer(), tool_format=chat.tool_format)
    openings = pool.reset(rows, renderer)
    prompts = [
        chat.prompt_ids(_task_opening(openings[i * num_samples : (i + 1) * num_samples], task))
        for i, task in enumerate(task_ids)
    ]
    limit = engine.config.context_limit - engine.config.max_new_tokens
    for task, prompt in zip(task_ids, prompts):
        if len(prompt) > limit:
            raise ValueError(
                f"task {task}: prompt of {len(prompt)} tokens leaves no room for a reply "
                f"(context_limit - max_new_tokens = {limit})"
            )
    return prompts


def generate_episodes(
    engine: rollout_lib.RolloutEngine,
    params: Any,
    chat: ChatFormat,
    pool: EnvPool,
    task_ids: Sequence[str],
    num_samples: int,
    seed: int,
    renderer: Any = None,
    first_row: int = 0,
) -> EpisodeBatch:
    """Runs `num_samples` episodes of every task on this host to the end, every live row taking
    its turn together (module docstring); row r samples as row first_row + r of `seed`."""
    timings = {"generate_s": 0.0, "env_s": 0.0}
    t0 = time.perf_counter()
    prompts = _open_episodes(engine, chat, pool, task_ids, num_samples, renderer)
    rows = len(prompts) * num_samples
    timings["env_s"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    rollout = engine.start(params, prompts, num_samples, seed, first_row=first_row)
    turns = rollout.generate()
    timings["generate_s"] += time.perf_counter() - t0
    done = np.zeros(rows, bool)
    while turns:
        t0 = time.perf_counter()
        texts: list[str | None] = [None] * rows
        for r, turn in turns.items():
            if turn.stop_reason == rollout_lib.CONTEXT_LIMIT and not turn.ids:
                continue  # no reply fits: the pool ends this episode as it stands
            texts[r] = _reply_text(chat, turn.ids)
        pool.stop([r for r in turns if texts[r] is None])
        observations, done = pool.step(texts)
        env_ids, cut = {}, []
        for r, turn in turns.items():
            if done[r] or texts[r] is None:
                continue
            if turn.stop_reason == rollout_lib.CONTEXT_LIMIT:
                cut.append(r)  # the reply filled the context: nothing more can follow
                continue
            closed = chat.turn_closed(turn.ids)
            env_ids[r] = chat.env_ids(observations[r], turn_closed=closed)
        pool.stop(cut)
        timings["env_s"] += time.perf_counter() - t0
        if not env_ids:
            break
        t0 = time.perf_counter()
        turns = rollout.generate(env_ids)
        timings["generate_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    results = pool.results()
    timings["env_s"] += time.perf_counter() - t0
    return EpisodeBatch(rollout.sequences(), results, timings)


def stream_episodes(
    engine: rollout_lib.RolloutEngine,
    params: Any,
    chat: ChatFormat,
    pool: EnvPool,
    task_ids: Sequence[str],
    num_samples: int,
    seed: int,
    slots: int,
    renderer: Any = None,
    first_row: int = 0,
) -> EpisodeBatch:
    """`generate_episodes` with continuous batching (`seal_jax.continuous`): the episodes
    stream through `slots` decode slots, and a finished episode's slot takes the next one.
    The replies whose turns end in one decode round go to the pool at once and are answered
    while the next round decodes; their rows continue in the round after. That schedule depends
    only on the episodes, never on how fast the pool answers, so a run is reproducible to the
    bit (resume) and gives `generate_episodes`' tokens for the same seed and rows. `timings`
    count the time this thread spent decoding (generate_s) and waiting for the pool (env_s)."""
    timings = {"generate_s": 0.0, "env_s": 0.0}
    t0 = time.perf_counter()
    prompts = _open_episodes(engine, chat, pool, task_ids, num_samples, renderer)
    timings["env_s"] += time.perf_counter() - t0
    stream = continuous.ContinuousRollout(engine, params, slots, seed, first_row)
    for i, prompt in enumerate(prompts):
        stream.add(prompt, range(i * num_samples, (i + 1) * num_samples))
    in_pool: dict[int, rollout_lib.Turn] = {}  # rows whose reply the pool has: their turn
    while stream.busy:
        preemption.check()  # a stop signal abandons a training rollout here
        t0 = time.perf_counter()
        turns = stream.step() if stream.decoding else {}
        timings["generate_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        answers = {}
        while pool.in_flight:  # the last round's replies, answered during this round
            answers.update((r, (obs, done)) for r, obs, done in pool.poll(timeout=None))
        for r in sorted(answers):
            observation, done = answers[r]
            turn = in_pool.pop(r)
            if done or turn.stop_reason == rollout_lib.CONTEXT_LIMIT:
                pool.stop([r])  # a reply that filled the context: nothing more can follow
                stream.finish(r)
            else:
                closed = chat.turn_closed(turn.ids)
                stream.extend(r, chat.env_ids(observation, turn_closed=closed))
        for r, turn in sorted(turns.items()):
            if turn.stop_reason == rollout_lib.CONTEXT_LIMIT and not turn.ids:
                pool.stop([r])  # no reply fits: the pool ends this episode as it stands
                continue
            in_pool[r] = turn
            pool.submit(r, _reply_text(chat, turn.ids))
        timings["env_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    results = pool.results()
    timings["env_s"] += time.perf_counter() - t0
    sequences = stream.sequences()
    return EpisodeBatch([sequences[r] for r in range(len(sequences))], results, timings)


def concatenate(batches: Sequence[EpisodeBatch], parallel: bool) -> EpisodeBatch:
    """One batch from several, rows in order; timings add up (sequential chunks) or take the
    maximum (`parallel`: the same step on several hosts)."""
    combine = max if parallel else sum
    return EpisodeBatch(
        sequences=[q for b in batches for q in b.sequences],
        results=[r for b in batches for r in b.results],
        timings={k: combine(b.timings[k] for b in batches) for k in ("generate_s", "env_s")},
    )


def host_share(items: Sequence[Any]) -> tuple[int, list[Any]]:
    """This process's contiguous share of `items` and the index of its first item (the first
    processes take one more when the count does not divide evenly); all shares in process
    order give `items` back."""
    n, p = jax.process_count(), jax.process_index()
    size, extra = divmod(len(items), n)
    start = p * size + min(p, extra)
    return start, list(items[start : start + size + (p < extra)])


def collect_episodes(
    engine: rollout_lib.RolloutEngine,
    params: Any,
    chat: ChatFormat,
    pool: EnvPool,
    *,
    task_ids: Sequence[str],
    num_samples: int,
    seed: int,
    renderer: Any = None,
    chunk_tasks: int = 0,
    slots: int = 0,
    abandonable: bool = False,
) -> EpisodeBatch:
    """Every host's episodes of `task_ids` (`num_samples` each), rows in task order.

    This host runs its `host_share` through `slots` continuous-batching slots
    (`stream_episodes`), or, with slots=0, in lockstep chunks of `chunk_tasks` tasks (0: one
    chunk), which bounds the KV cache of one rollout. Row r of the whole batch samples as row r
    of seed `seed * 2**20` (the seed the first chunk of the first host has always used), so
    the episodes do not depend on the host count, the chunks or the slots. `abandonable`: a stop
    signal abandons this host's rollout (`seal_jax.preemption.host_local`), and then every
    host's, raising `preemption.Preempted`.
    """
    params = engine.sampling_params(params)  # on several hosts, a copy on this host's chips
    first, mine = host_share(task_ids)
    seed, g = seed * 2**20, num_samples
    common = dict(num_samples=g, seed=seed, renderer=renderer)

    def run_here() -> EpisodeBatch:
        if slots:
            return stream_episodes(
                engine, params, chat, pool, mine, slots=slots, first_row=first * g, **common
            )
        chunk = chunk_tasks or len(mine)
        local = [
            generate_episodes(
                engine,
                params,
                chat,
                pool,
                mine[start : start + chunk],
                first_row=(first + start) * g,
                **common,
            )
            for start in range(0, len(mine), chunk)
        ]
        return concatenate(local, parallel=False)

    local = preemption.host_local(run_here) if abandonable else run_here()
    gathered = distributed.allgather_objects(local)
    preemption.raise_if_abandoned(gathered)
    return concatenate(gathered, parallel=True)


def generation_prompt_len(chat: ChatFormat) -> int:
    """Ids the chat template appends to open an assistant turn, which every prompt ends with
    (Qwen2.5: `<|im_start|>`, `assistant` and a newline)."""
    opening = [{"role": "user", "content": "."}]
    with_prompt = chat.encode(chat.render(opening, add_generation_prompt=True))
    return len(with_prompt) - len(chat.encode(chat.render(opening)))


def training_sequences(
    sequences: Sequence[rollout_lib.TokenSequence], chat: ChatFormat, max_response_tokens: int
) -> list[rollout_lib.TokenSequence]:
    """The sequences as the update trains on them: each cut after its first `max_response_tokens`
    ids past the initial prompt (train.max_response_tokens; 0: whole). They are counted as the
    SEAL release counts its response: from the first assistant turn's opening ids on (the end of
    the prompt ids here), tool and user ids included (`trajectories.cap_response`)."""
    if not max_response_tokens:
        return list(sequences)
    opening = generation_prompt_len(chat)
    return [
        trajectories.cap_response(s, max_response_tokens, s.prompt_len - opening) for s in sequences
    ]


def chunk_rows(config: Any) -> int:
    """Rows decoded together in a training step on one host: rollout.slots, or (lockstep)
    rollout.micro_batch_tasks (0: the step's batch_tasks) x rl.group_size."""
    if config.rollout.slots:
        return config.rollout.slots
    return (config.rollout.micro_batch_tasks or config.train.batch_tasks) * config.rl.group_size


def open_pool(source: TaskSource, env_config: Any, mode: str) -> EnvPool:
    """An environment pool over the source's tasks with `config.env`'s settings, in episode
    `mode` (environments.episode.MODES)."""
    episode = EpisodeConfig.from_config(env_config, mode)
    config = PoolConfig(
        num_workers=env_config.num_workers,
        episode=episode,
        request_timeout_s=env_config.worker_timeout_s,
        max_worker_rss_mb=env_config.worker_memory_mb,
    )
    return EnvPool(source.load_task, config)


def rollout_metrics(batch: EpisodeBatch) -> dict:
    """Rewards, success per category, tag fractions, format-error and empty-reply rates, model
    calls, context-limit stops, generated tokens, and the episodes that environment faults
    ended, by kind (`environments.pool.fault_kind`), of a batch."""
    results = batch.results
    per_cat: dict[str, list[float]] = {}
    for result in results:
        per_cat.setdefault(result.category, []).append(result.reward)
    all_tags = [t for r in results for t in r.turn_tags]
    kinds = [k for r in results for turn in r.turn_error_kinds for k in turn]
    replies = [m for r in results for m in r.transcript if m["role"] == "assistant"]
    stops = [s.stop_reason for s in batch.sequences]
    faults = [fault_kind(r.failure_reason) for r in results]
    return {
        "reward_mean": float(np.mean([r.reward for r in results])),
        "success": {c: float(np.mean(v)) for c, v in per_cat.items()},
        "tag_fraction": {t: all_tags.count(t) / max(len(all_tags), 1) for t in set(all_tags)},
        "format_error_rate": kinds.count("unparseable") / max(len(replies), 1),
        "empty_reply_rate": sum(not m["content"].strip() for m in replies) / max(len(replies), 1),
        "calls_per_episode": float(np.mean([r.model_calls for r in results])),
        "context_limit_fraction": stops.count(rollout_lib.CONTEXT_LIMIT) / len(stops),
        "tokens_generated": sum(int(s.loss_mask.sum()) for s in batch.sequences),
        "env_faults": {kind: faults.count(kind) for kind in FAULTS.values()},
    }

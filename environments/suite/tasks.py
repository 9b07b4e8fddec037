"""Procedurally generated tasks of the suite, in BFCL's four categories, and the fixed split.

A task is one to three user turns over a small random scenario. Each turn is a request
("intent") with its ground-truth calls; the generator tracks the tool state while it writes
them, so later requests stay consistent with earlier ones. Categories:

* base: one or two requests.
* long_context: a reading request then another, on scenarios loaded in long-context mode
  (extra files, extra inbox messages, a trip log in every car result).
* miss_param: a state-changing request with one value left out ("Delete a file for me."); the
  turn has no ground truth (the right move is to ask) and the next user turn makes the whole
  request (so that a small policy needs no earlier turn to act on it).
* miss_func: a state-changing request whose tool is held back; the turn has no ground truth
  (the right move is a plain-text answer) and the next turn reveals the tool, then makes the
  request again.

Only state-changing requests are made too early: acting on one (with a guessed value, or with
any tool at hand) then changes the state (the tools count their changes), which the official
check of the following turn catches.
"""

import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from environments.suite.tools import (
    AC_RANGE,
    CLASSES,
    DOCS,
    DRIVE_MODES,
    FOLDERS,
    LIGHT_MODES,
    TOOLS_OF,
    USERS,
)
from environments.task import ToolTask

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
SPLIT_SEEDS = {"train": 2605, "eval": 2606}
TASKS_PER_CATEGORY = {"train": 100, "eval": 50}
SYSTEM_PREAMBLE = "You are a helpful assistant."

FILE_NAMES = ("plan.txt", "notes.txt", "todo.txt", "report.txt", "draft.txt", "list.txt")
FILE_TEXTS = ("buy milk", "call ben", "meet at noon", "pay rent", "fix the car")
MESSAGES = ("hello", "call me", "see you", "on my way", "thanks")
_ID_PREFIX = "multi_turn_"
_MAX_ATTEMPTS_PER_TASK = 200


@dataclass
class _World:
    """The tool state while a task is written: files, car, messenger (mutated by requests)."""

    files: dict
    lights: str
    ac_temp: int
    engine: str
    user: str | None
    inbox: list

    def scenario(self) -> dict:
        """The initial_config of every class (taken before any request changes the world)."""
        return {
            "Files": {"files": json.loads(json.dumps(self.files))},
            "Car": {"lights": self.lights, "ac_temp": self.ac_temp},
            "Messenger": {"user": self.user, "inbox": list(self.inbox)},
        }


@dataclass(frozen=True)
class _Request:
    """One user request and its ground truth.

    `vague` is the request with one value left out, or None when the request has no value
    worth leaving out.
    """

    text: str
    calls: tuple[str, ...]
    classes: tuple[str, ...]
    vague: str | None

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools the ground truth calls, in order."""
        return tuple(call.split("(", 1)[0] for call in self.calls)


def _call(tool: str, **arguments: object) -> str:
    """A ground-truth call string such as `move_file(name='a.txt', folder='docs')`."""
    return f"{tool}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def _random_world(rng: random.Random) -> _World:
    """Three files in random folders, a car with the engine off, maybe a logged-in user."""
    names = rng.sample(FILE_NAMES, 3)
    files = {n: {"folder": rng.choice(FOLDERS), "text": rng.choice(FILE_TEXTS)} for n in names}
    user = rng.choice((None,) + USERS)
    senders = [u for u in USERS if u != user]
    inbox = [{"from": rng.choice(senders), "text": rng.choice(MESSAGES)} for _ in range(2)]
    lights = rng.choice(LIGHT_MODES)
    return _World(files, lights, rng.randint(*AC_RANGE), "off", user, inbox)


def _move(rng: random.Random, w: _World) -> _Request:
    name = rng.choice(sorted(w.files))
    folder = rng.choice([f for f in FOLDERS if f != w.files[name]["folder"]])
    w.files[name]["folder"] = folder
    call = _call("move_file", name=name, folder=folder)
    return _Request(f"Move {name} to {folder}.", (call,), ("Files",), f"Move {name} somewhere.")


def _delete(rng: random.Random, w: _World) -> _Request:
    name = rng.choice(sorted(w.files))
    del w.files[name]
    call = _call("delete_file", name=name)
    return _Request(f"Delete {name}.", (call,), ("Files",), "Delete a file for me.")


def _read(rng: random.Random, w: _World) -> _Request:
    name = rng.choice(sorted(w.files))
    return _Request(f"What does {name} say?", (_call("read_file", name=name),), ("Files",), None)


def _list(rng: random.Random, w: _World) -> _Request:
    folder = rng.choice(FOLDERS)
    call = _call("list_files", folder=folder)
    return _Request(f"Which files are in {folder}?", (call,), ("Files",), None)


def _lights(rng: random.Random, w: _World) -> _Request:
    w.lights = rng.choice([m for m in LIGHT_MODES if m != w.lights])
    call = _call("set_lights", mode=w.lights)
    return _Request(f"Set the lights to {w.lights}.", (call,), ("Car",), "Change the lights.")


def _ac(rng: random.Random, w: _World) -> _Request:
    w.ac_temp = rng.choice([t for t in range(AC_RANGE[0], AC_RANGE[1] + 1) if t != w.ac_temp])
    call = _call("set_ac", temp=w.ac_temp)
    return _Request(f"Set the AC to {w.ac_temp} degrees.", (call,), ("Car",), "Change the AC.")


def _start(rng: random.Random, w: _World) -> _Request | None:
    if w.engine == "on":
        return None
    w.engine = "on"
    mode = rng.choice(DRIVE_MODES)
    calls = (_call("press_brake"), _call("start_engine", mode=mode))
    return _Request(f"Start the engine in {mode} mode.", calls, ("Car",), "Start the engine.")


def _login_first(rng: random.Random, w: _World) -> tuple[str, tuple[str, ...]]:
    """The "I am ..." prefix and login call a messenger request needs, if any.

    Logged out: the user names themself and the ground truth logs in first. Logged in: the
    user sometimes still names themself (the same user; logging in again changes nothing).
    """
    if w.user is None:
        w.user = rng.choice(USERS)
        return f"I am {w.user}. ", (_call("login", user=w.user),)
    return (f"I am {w.user}. " if rng.random() < 0.5 else ""), ()


def _send(rng: random.Random, w: _World) -> _Request:
    prefix, login = _login_first(rng, w)
    to = rng.choice([u for u in USERS if u != w.user])
    text = rng.choice(MESSAGES)
    vague = f"Send a message to {to}." if rng.random() < 0.5 else f"Send '{text}' to a friend."
    calls = login + (_call("send", to=to, text=text),)
    return _Request(f"{prefix}Send '{text}' to {to}.", calls, ("Messenger",), prefix + vague)


def _inbox(rng: random.Random, w: _World) -> _Request:
    prefix, login = _login_first(rng, w)
    calls = login + (_call("read_inbox"),)
    return _Request(f"{prefix}Check my inbox.", calls, ("Messenger",), None)


def _forward(rng: random.Random, w: _World) -> _Request | None:
    if w.user is None:
        return None
    name = rng.choice(sorted(w.files))
    to = rng.choice([u for u in USERS if u != w.user])
    calls = (_call("read_file", name=name), _call("send", to=to, text=w.files[name]["text"]))
    vague = f"Send the text of {name} to a friend."
    return _Request(f"Send the text of {name} to {to}.", calls, ("Files", "Messenger"), vague)


Intent = Callable[[random.Random, _World], _Request | None]
INTENTS: dict[str, Intent] = {
    "move": _move,
    "delete": _delete,
    "read": _read,
    "list": _list,
    "lights": _lights,
    "ac": _ac,
    "start": _start,
    "send": _send,
    "inbox": _inbox,
    "forward": _forward,
}
READING_INTENTS = ("read", "list", "inbox")


def _request(
    rng: random.Random,
    w: _World,
    names: tuple[str, ...],
    accept: Callable[[_Request], bool] | None = None,
) -> _Request:
    """Draws requests from the named intents until one applies (and passes `accept`).

    The world is only changed by the request returned.
    """
    for _ in range(_MAX_ATTEMPTS_PER_TASK):
        trial = _World(**json.loads(json.dumps(vars(w))))
        request = INTENTS[rng.choice(names)](rng, trial)
        if request is not None and (accept is None or accept(request)):
            vars(w).update(vars(trial))
            return request
    raise RuntimeError(f"no request among {names} fits the task being written")


def _shown_docs(rng: random.Random, requests: list[_Request], held: str | None) -> list[dict]:
    """The tools shown from the start: the needed ones plus distractors of the same classes.

    Between 2 and 4 tools (more only if the requests need more), in a fixed class order.
    """
    needed = {t for r in requests for t in r.tools} - {held}
    classes = {c for r in requests for c in r.classes}
    pool = [t for c in TOOLS_OF if c in classes for t in TOOLS_OF[c] if t != held]
    spare = [t for t in pool if t not in needed]
    target = max(len(needed), rng.randint(2, 4))
    chosen = needed | set(rng.sample(spare, min(len(spare), target - len(needed))))
    return [DOCS[t] for t in pool if t in chosen]


def _draw_task(rng: random.Random, category: str, task_id: str) -> ToolTask:
    """Writes one task of `category`: a scenario, the user turns and their ground truth."""
    world = _random_world(rng)
    scenario = world.scenario()
    everything = tuple(INTENTS)
    plain = {"base": rng.randint(1, 2), "long_context": 2}.get(category, 0)
    requests, turns, truth = [], [], []
    held, revealed = None, {}

    def fits(request: _Request) -> bool:
        """Keeps a task within two classes and four needed tools."""
        classes = {c for r in requests + [request] for c in r.classes}
        return len(classes) <= 2 and len({t for r in requests + [request] for t in r.tools}) <= 4

    for i in range(plain):
        names = READING_INTENTS if category == "long_context" and i == 0 else everything
        requests.append(_request(rng, world, names, fits))
        turns.append([requests[-1].text])
        truth.append(list(requests[-1].calls))
    if category in ("miss_param", "miss_func"):
        # A state-changing request: acting on it too early shows in the state, so the only
        # passing move on the first of its two turns is to answer in plain text.
        special = _request(rng, world, everything, lambda r: r.vague is not None)
        requests.append(special)
        first = special.vague if category == "miss_param" else special.text
        turns += [[first], [special.text]]
        truth += [[], list(special.calls)]
        if category == "miss_func":
            held = special.tools[-1]
            revealed = {len(turns) - 1: [DOCS[held]]}
    classes = [c for c in CLASSES if any(c in r.classes for r in requests)]
    return ToolTask(
        task_id=task_id,
        category=category,
        turns=[[{"role": "user", "content": text} for text in turn] for turn in turns],
        docs=_shown_docs(rng, requests, held),
        ground_truth=truth,
        classes={c: CLASSES[c] for c in classes},
        initial_config={c: scenario[c] for c in classes},
        revealed_docs=revealed,
        long_context=category == "long_context",
        system_preamble=SYSTEM_PREAMBLE,
    )


def content_key(task: ToolTask) -> str:
    """Everything that defines a task except its id: equal keys mean the same task."""
    shown = [d["name"] for d in task.docs]
    revealed = {t: [d["name"] for d in docs] for t, docs in task.revealed_docs.items()}
    fields = [task.category, task.turns, task.initial_config, task.ground_truth, shown, revealed]
    return json.dumps(fields, sort_keys=True)


def make_tasks(
    seed: int, n_per_category: int, tag: str = "", exclude: frozenset[str] = frozenset()
) -> list[ToolTask]:
    """Generates `n_per_category` distinct tasks per category, deterministically from `seed`.

    Args:
      seed: the random seed; the same seed gives the same tasks.
      n_per_category: tasks per category.
      tag: the id suffix stem; ids are "multi_turn_{category}_{tag}-{n}" (tag defaults to
        "s{seed}").
      exclude: content keys (see `content_key`) of tasks that must not be generated again,
        e.g. the training tasks when drawing evaluation tasks.
    Raises:
      ValueError: the generator cannot find enough distinct tasks.
    """
    rng = random.Random(seed)
    tag = tag or f"s{seed}"
    seen = set(exclude)
    tasks = []
    for category in CATEGORIES:
        for n in range(n_per_category):
            task_id = f"{_ID_PREFIX}{category}_{tag}-{n}"
            for _ in range(_MAX_ATTEMPTS_PER_TASK):
                task = _draw_task(rng, category, task_id)
                if content_key(task) not in seen:
                    break
            else:
                raise ValueError(f"could not draw {n_per_category} distinct {category} tasks")
            seen.add(content_key(task))
            tasks.append(task)
    return tasks


def _check_split(split: str) -> None:
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")


@functools.cache
def _split_tasks(split: str) -> tuple[ToolTask, ...]:
    """The tasks of a split; evaluation tasks exclude every training task's content."""
    _check_split(split)
    exclude = frozenset()
    if split == "eval":
        exclude = frozenset(content_key(t) for t in _split_tasks("train"))
    seed, n = SPLIT_SEEDS[split], TASKS_PER_CATEGORY[split]
    return tuple(make_tasks(seed, n, tag=split, exclude=exclude))


def load_tasks(split: str) -> list[ToolTask]:
    """Returns the tasks of "train" (100 per category) or "eval" (50 per category)."""
    return list(_split_tasks(split))


def split_ids(split: str) -> list[str]:
    """Returns the task ids of "train" or "eval", category by category."""
    return [task.task_id for task in _split_tasks(split)]


def category_of(task_id: str) -> str:
    """Returns the category of a suite task id such as "multi_turn_miss_func_eval-3"."""
    stem, _, key = task_id.rpartition("_")
    category = stem.removeprefix(_ID_PREFIX)
    if not stem.startswith(_ID_PREFIX) or category not in CATEGORIES or "-" not in key:
        raise ValueError(
            f"not a suite task id: {task_id!r} (expected multi_turn_<category>_<split>-<n>)"
        )
    return category


@functools.cache
def _tasks_by_id() -> dict[str, ToolTask]:
    """Every task of both splits, keyed by id."""
    return {t.task_id: t for split in SPLIT_SEEDS for t in _split_tasks(split)}


def load_task(task_id: str) -> ToolTask:
    """Returns the suite task with this id; raises ValueError for an unknown id."""
    category_of(task_id)
    if task_id not in _tasks_by_id():
        raise ValueError(f"no suite task with id {task_id!r}")
    return _tasks_by_id()[task_id]

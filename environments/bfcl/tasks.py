"""The 800 BFCL v3 multi-turn tasks, read from the installed `bfcl-eval` package, and the split."""

import functools
import importlib
import json
import random
from pathlib import Path

import bfcl_eval
from bfcl_eval.constants.executable_backend_config import (
    CLASS_FILE_PATH_MAPPING,
    MULTI_TURN_FUNC_DOC_FILE_MAPPING,
)

from environments.task import ToolTask

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
SPLIT_SEED = 2605
TRAIN_PER_CATEGORY = 100
# The 400/400 splits by name (config env.bfcl_split): "release", the ids the official SEAL
# release trains and evaluates on (its data/bfcl_train.parquet and data/bfcl_eval_400.parquet);
# "seeded", this project's own draw (`make_split(SPLIT_SEED)`). The first is the default.
SPLIT_FILES = {
    "release": Path(__file__).with_name("release_split.json"),
    "seeded": Path(__file__).with_name("split.json"),
}
SPLITS = tuple(SPLIT_FILES)
DATA_DIR = Path(bfcl_eval.__file__).parent / "data"


def _read_jsonl(path: Path) -> list[dict]:
    """Reads a JSON-lines file."""
    with path.open() as file:
        return [json.loads(line) for line in file if line.strip()]


@functools.cache
def _function_docs(class_name: str) -> tuple[dict, ...]:
    """The function docs BFCL shows for one tool class."""
    return tuple(
        _read_jsonl(DATA_DIR / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name])
    )


@functools.cache
def _tool_class(class_name: str) -> type:
    """Imports one BFCL tool class."""
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


@functools.cache
def raw_entries(category: str) -> tuple[tuple[dict, dict], ...]:
    """Returns the (question entry, possible answer) pairs of one category, in file order."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; use one of {CATEGORIES}")
    name = f"BFCL_v4_multi_turn_{category}.json"
    entries = _read_jsonl(DATA_DIR / name)
    answers = {a["id"]: a for a in _read_jsonl(DATA_DIR / "possible_answer" / name)}
    return tuple((entry, answers[entry["id"]]) for entry in entries)


def category_of(task_id: str) -> str:
    """Returns the category of a task id such as "multi_turn_miss_func_12"."""
    prefix = task_id.rsplit("_", 1)[0]
    category = prefix.removeprefix("multi_turn_")
    if not task_id.startswith("multi_turn_") or category not in CATEGORIES:
        raise ValueError(f"not a BFCL multi-turn task id: {task_id!r}")
    return category


def build_task(entry: dict, answer: dict) -> ToolTask:
    """Turns a BFCL entry and its possible answer into a ToolTask, as BFCL's pipeline sees it.

    Held-back functions of `miss_func` are removed from the initial docs and revealed at the
    turn BFCL names; long-context tasks load their scenarios in long-context mode.
    """
    classes = entry["involved_classes"]
    docs = [dict(doc) for name in classes for doc in _function_docs(name)]
    revealed = {}
    for turn, names in entry.get("missed_function", {}).items():
        by_name = {doc["name"]: doc for doc in docs}  # revealed in missed_function's order
        revealed[int(turn)] = [by_name[name] for name in names if name in by_name]
        docs = [doc for doc in docs if doc["name"] not in names]
    category = category_of(entry["id"])
    return ToolTask(
        task_id=entry["id"],
        category=category,
        turns=entry["question"],
        docs=docs,
        ground_truth=answer["ground_truth"],
        classes={name: _tool_class(name) for name in classes},
        initial_config=entry.get("initial_config", {}),
        revealed_docs=revealed,
        long_context=category == "long_context",
    )


@functools.cache
def _tasks_by_id() -> dict[str, tuple[dict, dict]]:
    """All raw entries keyed by id."""
    return {e["id"]: (e, a) for c in CATEGORIES for e, a in raw_entries(c)}


def all_task_ids() -> list[str]:
    """Returns the 800 task ids, category by category in file order."""
    return list(_tasks_by_id())


def load_task(task_id: str) -> ToolTask:
    """Returns the ToolTask for a BFCL multi-turn id; raises ValueError for an unknown id."""
    category_of(task_id)
    if task_id not in _tasks_by_id():
        raise ValueError(f"no BFCL multi-turn task with id {task_id!r}")
    return build_task(*_tasks_by_id()[task_id])


def make_split(seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """Draws the "seeded" split: TRAIN_PER_CATEGORY training ids per category, the rest eval."""
    rng = random.Random(seed)
    train, evaluation = [], []
    for category in CATEGORIES:
        ids = [entry["id"] for entry, _ in raw_entries(category)]
        chosen = set(rng.sample(ids, TRAIN_PER_CATEGORY))
        train += [i for i in ids if i in chosen]
        evaluation += [i for i in ids if i not in chosen]
    return {"train": train, "eval": evaluation}


def split_ids(split: str, bfcl_split: str = SPLITS[0]) -> list[str]:
    """Returns the task ids of "train" or "eval" in the split named `bfcl_split` (SPLIT_FILES)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return list(_split_file(bfcl_split)[split])


@functools.cache
def _split_file(bfcl_split: str) -> dict:
    """The committed split file of one split name."""
    if bfcl_split not in SPLIT_FILES:
        raise ValueError(f"unknown BFCL split {bfcl_split!r}; use one of {', '.join(SPLITS)}")
    return json.loads(SPLIT_FILES[bfcl_split].read_text())

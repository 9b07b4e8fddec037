"""Task sources by name: how the trainer finds an environment's tasks, split and categories."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from environments.task import ToolTask


@dataclasses.dataclass(frozen=True)
class TaskSource:
    """One environment's tasks.

    Attributes:
      name: the config name (`config.env.name`).
      load_task: task id -> ToolTask (picklable: worker processes call it).
      split_ids: "train" | "eval" -> task ids, in a fixed order.
      category_of: task id -> category.
      categories: all categories, in report order.
    """

    name: str
    load_task: Callable[[str], ToolTask]
    split_ids: Callable[[str], list[str]]
    category_of: Callable[[str], str]
    categories: tuple[str, ...]


def _bfcl(bfcl_split: str | None) -> TaskSource:
    from environments.bfcl import tasks

    split_ids = functools.partial(tasks.split_ids, bfcl_split=bfcl_split or tasks.SPLITS[0])
    split_ids("train")  # an unknown split name fails here, not in the middle of a run
    return TaskSource("bfcl", tasks.load_task, split_ids, tasks.category_of, tasks.CATEGORIES)


def _suite(bfcl_split: str | None) -> TaskSource:
    del bfcl_split  # the suite has one split
    from environments import suite

    return TaskSource(
        "suite", suite.load_task, suite.split_ids, suite.category_of, suite.CATEGORIES
    )


SOURCES: dict[str, Callable[[str | None], TaskSource]] = {"bfcl": _bfcl, "suite": _suite}


def get_source(name: str, bfcl_split: str | None = None) -> TaskSource:
    """The task source called `name`; BFCL's tasks split as `bfcl_split` names
    (`environments.bfcl.tasks.SPLITS`, config env.bfcl_split; None: the first, "release").
    Raises ValueError naming the known environments or splits."""
    if name not in SOURCES:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(SOURCES))}")
    return SOURCES[name](bfcl_split)

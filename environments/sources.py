"""Task sources by name: how the trainer finds an environment's tasks, split and categories."""

from __future__ import annotations

import dataclasses
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


def _bfcl() -> TaskSource:
    from environments.bfcl import tasks

    return TaskSource("bfcl", tasks.load_task, tasks.split_ids, tasks.category_of, tasks.CATEGORIES)


def _suite() -> TaskSource:
    from environments import suite

    return TaskSource(
        "suite", suite.load_task, suite.split_ids, suite.category_of, suite.CATEGORIES
    )


SOURCES: dict[str, Callable[[], TaskSource]] = {"bfcl": _bfcl, "suite": _suite}


def get_source(name: str) -> TaskSource:
    """The task source called `name`; raises ValueError naming the known ones."""
    if name not in SOURCES:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]()

"""The docs' compile tables are the rendering of benchmarks/results/compile_targets.json.

`python -m benchmarks.compile_targets` records every hardware target's compile check in that
JSON; its `--render` writes the tables of BUILD.md and benchmarks/README.md from it. A change that
moves a compiled figure must change the JSON and the tables together, or these tests fail. No
libtpu needed: nothing is compiled here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from benchmarks import compile_targets as ct
from seal_jax.aot import ProgramMemory
from tests.devices import REPO


@pytest.fixture(scope="module")
def results() -> dict:
    return ct.load_results()


@pytest.mark.parametrize("doc", ct.DOCS)
def test_doc_tables_equal_their_rendering(doc, results):
    text = (Path(REPO) / doc).read_text()
    assert ct.marked_tables(text), f"{doc} marks no compile_targets table"
    assert ct.render(text, results) == text, (
        f"{doc}'s compile tables differ from benchmarks/results/compile_targets.json: run "
        "python -m benchmarks.compile_targets --render (or recompile the targets that moved)"
    )


def test_every_table_is_in_the_docs_once():
    marked = [name for doc in ct.DOCS for name in ct.marked_tables((Path(REPO) / doc).read_text())]
    assert sorted(marked) == sorted(ct.TABLES)
    assert ct.marked_tables((Path(REPO) / "BUILD.md").read_text()) == ["build"]


def test_every_target_is_recorded_and_consistent(results):
    assert list(results["targets"]) == ct.TARGETS
    for target, entry in results["targets"].items():
        assert entry["versions"]["libtpu"] and entry["commit"], target
        hbm, fits = entry["hbm_bytes_per_chip"], []
        for p in entry["programs"]:
            memory = ProgramMemory(
                p["name"],
                p["argument_bytes"],
                p["output_bytes"],
                p["temp_bytes"],
                p["other_resident_bytes"],
                p["error"],
            )
            assert p["peak_bytes_per_chip"] == memory.peak_bytes, (target, p["name"])
            fits.append(memory.peak_bytes <= hbm and not p["error"])
            assert p["fits"] == fits[-1], (target, p["name"])
        assert entry["fits"] == all(fits), target


def test_a_moved_figure_moves_the_table(results):
    text = (Path(REPO) / "BUILD.md").read_text()
    moved = copy.deepcopy(results)
    decode = next(
        p for p in moved["targets"]["7b-v5p-8"]["programs"] if p["name"] == "rollout_decode"
    )
    before = ct._gib(decode["peak_bytes_per_chip"])
    decode["peak_bytes_per_chip"] += 3 * ct.GIB
    after = ct._gib(decode["peak_bytes_per_chip"])
    row = next(line for line in ct.render(text, moved).splitlines() if "`7b-v5p-8`" in line)
    assert row.split(" | ")[4].endswith(f" / {after}") and before != after
    # Rendering the moved results and then the recorded ones gives the doc back.
    assert ct.render(ct.render(text, moved), results) == text


def test_bad_markers_are_one_clear_error(results):
    with pytest.raises(ValueError, match="unknown compile_targets table 'nope'"):
        ct.render("<!-- compile_targets: nope -->\n<!-- /compile_targets -->\n", results)
    with pytest.raises(ValueError, match="has no"):
        ct.render("<!-- compile_targets: build -->\n| stale |\n", results)
    missing = {"targets": {k: v for k, v in results["targets"].items() if k != "7b-v4-8"}}
    with pytest.raises(ValueError, match="no entry for 7b-v4-8"):
        ct.table("build", missing)

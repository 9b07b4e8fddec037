"""The Colab notebook (notebooks/seal_colab.ipynb) stays valid and runnable, without jupyter.

The .ipynb JSON is checked against the nbformat 4 structure by hand (nbformat is not a
dependency). Then the notebook is executed the way a reader would, cell by cell, except the
install cell (tag `install`: git clone + `make install` need the network; CI has the project
installed already): the `parameters` cell runs as Python with a reduced budget and this
interpreter substituted, the `run` cell's shell lines (`!...`, with IPython's `{name}`
expansion) run in a subprocess from the repository root, and the `show` cell runs as Python
with IPython.display stubbed out; the report files must appear and be displayed.
"""

import json
import os
import re
import subprocess
import sys
import types

import pytest

from tests.devices import cpu_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "seal_colab.ipynb")
REDUCED_BUDGET = " ".join(
    [
        "--config.sft.steps=4",
        "--config.train.max_steps=1",
        "--config.train.eval_every=1",
        "--config.train.batch_tasks=2",
        "--config.rl.group_size=2",
        "--config.train.mini_batch_tasks=1",
        "--config.train.eval_limit=4",
        "--config.rollout.max_new_tokens=16",
        "--config.train.eval_max_new_tokens=16",
    ]
)
REPORT_FILES = ("report.md", "eval_success.png", "tag_distribution.png", "tag_utilities.png")


def load_notebook() -> dict:
    with open(NOTEBOOK) as f:
        return json.load(f)


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def cell_tagged(nb: dict, tag: str) -> dict:
    cells = [c for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"expected one cell tagged {tag!r}, found {len(cells)}"
    return cells[0]


def test_notebook_is_valid_nbformat_4():
    nb = load_notebook()
    assert nb["nbformat"] == 4 and isinstance(nb["nbformat_minor"], int)
    assert set(nb) >= {"cells", "metadata", "nbformat", "nbformat_minor"}
    assert nb["metadata"]["kernelspec"]["language"] == "python"
    ids = [c["id"] for c in nb["cells"]]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", i) for i in ids)
    for cell in nb["cells"]:
        assert cell["cell_type"] in ("code", "markdown", "raw")
        assert isinstance(cell["metadata"], dict)
        assert isinstance(source(cell), str)
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None  # saved clean
        else:
            assert "outputs" not in cell and "execution_count" not in cell
    for tag in ("parameters", "install", "run", "show"):
        assert cell_tagged(nb, tag)["cell_type"] == "code"
    # Cells in reading order: parameters, install, run, show.
    order = [
        nb["cells"].index(cell_tagged(nb, t)) for t in ("parameters", "install", "run", "show")
    ]
    assert order == sorted(order)
    install = source(cell_tagged(nb, "install"))
    assert "git clone {REPO_URL}" in install and "make install" in install
    params = source(cell_tagged(nb, "parameters"))
    assert re.search(r'^REPO_URL = "', params, re.M) and re.search(r'^BUDGET = ""', params, re.M)


def shell_lines(cell_source: str, namespace: dict) -> list[str]:
    """The cell's `!` lines with IPython's {name} expansion; any Python line is an error."""
    out = []
    for line in cell_source.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        assert stripped.startswith("!"), f"run cell line is not a shell command: {line!r}"
        out.append(stripped[1:].format(**namespace))
    return out


def test_notebook_runs_with_a_reduced_budget(tmp_path, monkeypatch):
    nb = load_notebook()
    namespace: dict = {}
    exec(source(cell_tagged(nb, "parameters")), namespace)
    assert namespace["BUDGET"] == ""  # the notebook's default is the full run
    workdir = str(tmp_path / "tiny")
    namespace.update(BUDGET=REDUCED_BUDGET, WORKDIR=workdir, PYTHON=sys.executable)
    commands = shell_lines(source(cell_tagged(nb, "run")), namespace)
    assert len(commands) == 1 and "run.py --config=configs/tiny.py" in commands[0]
    env = cpu_env()
    for command in commands:
        done = subprocess.run(
            command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in REPORT_FILES:
        assert os.path.getsize(os.path.join(workdir, name)) > 0, name
    with open(os.path.join(workdir, "report.md")) as f:
        report = f.read()
    assert "before RL" in report and "| **mean** |" in report

    # The show cell, with IPython.display stubbed: it displays the summary and each plot.
    shown = []
    display_module = types.ModuleType("IPython.display")
    display_module.Markdown = lambda text: ("markdown", text)
    display_module.Image = lambda filename: ("image", filename)
    display_module.display = shown.append
    ipython = types.ModuleType("IPython")
    ipython.display = display_module
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display_module)
    exec(source(cell_tagged(nb, "show")), namespace)
    images = [os.path.basename(x) for kind, x in shown if kind == "image"]
    assert set(images) >= {"eval_success.png", "tag_distribution.png", "tag_utilities.png"}
    assert shown[0][0] == "markdown" and "| **mean** |" in shown[0][1]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

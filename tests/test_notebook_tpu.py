"""The Colab TPU notebook (notebooks/seal_colab_tpu.ipynb) stays valid and runnable, on CPU.

Executed cell by cell as tests/test_notebook.py executes the CPU notebook, except the install
cell (network) and the download cell (network; a tiny random Qwen2.5-architecture checkpoint
with the real Qwen tokenizer is put where it would have put the weights): the TPU check must
stop a CPU runtime with its message (the test then names the target itself), the paths cell
runs with the local directory under pytest's tmp_path, the run cell's shell line runs with a
reduced budget, and the show cell runs with IPython.display stubbed out.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import types

import pytest

from configs import colab_tpu
from seal_jax import config as config_lib
from tests import hf_models
from tests.devices import EXECUTION_BOUND_XLA_FLAGS, cpu_env
from tests.test_notebook import ROOT, cell_tagged, shell_lines, source

NOTEBOOK = os.path.join(ROOT, "notebooks", "seal_colab_tpu.ipynb")
TAGS = ("parameters", "install", "check", "paths", "download", "run", "show")
REDUCED_BUDGET = " ".join(
    [
        "--config.train.max_steps=1",
        "--config.train.eval_every=1",
        "--config.train.batch_tasks=1",
        "--config.rl.group_size=2",
        "--config.train.mini_batch_tasks=1",
        "--config.optim.grad_accum=1",
        "--config.rollout.micro_batch_tasks=1",
        "--config.train.eval_limit=2",
        "--config.train.eval_batch_tasks=2",
        "--config.rollout.max_new_tokens=8",
        "--config.train.eval_max_new_tokens=8",
        "--config.rollout.context_limit=8192",
        "--config.rollout.min_batch=2",
        "--config.model.remat=False",
        "--config.model.logprob_chunk=1024",
        "--config.train.length_bucket=512",
        "--config.env.num_workers=1",
    ]
)
PLOTS = ("train_reward.png", "eval_success.png", "tag_distribution.png", "tag_utilities.png")


def load_notebook() -> dict:
    with open(NOTEBOOK) as f:
        return json.load(f)


def test_notebook_is_valid_nbformat_4_with_its_cells_in_order():
    nb = load_notebook()
    assert nb["nbformat"] == 4 and isinstance(nb["nbformat_minor"], int)
    assert nb["metadata"]["kernelspec"]["language"] == "python"
    assert nb["metadata"]["accelerator"] == "TPU"
    ids = [c["id"] for c in nb["cells"]]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", i) for i in ids)
    for cell in nb["cells"]:
        assert cell["cell_type"] in ("code", "markdown") and isinstance(cell["metadata"], dict)
        assert isinstance(source(cell), str)
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None  # saved clean
        else:
            assert "outputs" not in cell and "execution_count" not in cell
    order = [nb["cells"].index(cell_tagged(nb, tag)) for tag in TAGS]
    assert order == sorted(order)
    install = source(cell_tagged(nb, "install"))
    assert "make install" in install and '"jax[tpu]==0.10.2"' in install
    download = source(cell_tagged(nb, "download"))
    assert "snapshot_download(" in download and "local_dir=MODEL_DIR" in download
    for repo in ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"):
        assert repo in download
    # The one download: no other cell fetches weights.
    others = [source(c) for c in nb["cells"] if c is not cell_tagged(nb, "download")]
    assert not any("snapshot_download" in text or "huggingface" in text for text in others)


def test_every_colab_target_is_a_valid_config_on_one_chip():
    for target in colab_tpu.TARGETS:
        c = colab_tpu.get_config(target)
        config_lib.validate(c)
        assert c.aot.topology.endswith(":1x1") and target.split("-")[1] in c.aot.topology
        assert (c.rollout.context_limit, c.rl.group_size, c.env.name) == (16384, 8, "bfcl")
        assert c.train.eval_batch_tasks == c.rollout.micro_batch_tasks * c.rl.group_size
    c = colab_tpu.get_config("vanilla_grpo,1.5b-v6e-1")
    assert not c.weighting.enabled and c.aot.topology == "v6e:1x1"
    for bad in ("", "7b-v5p-8", "0.5b-v5e-1,1.5b-v5e-1", "seal,vanilla_grpo,0.5b-v5e-1"):
        with pytest.raises(ValueError, match="give one target"):
            colab_tpu.get_config(bad)


def stub_ipython(monkeypatch: pytest.MonkeyPatch) -> list:
    """IPython.display with display() appending to the returned list."""
    shown: list = []
    display_module = types.ModuleType("IPython.display")
    display_module.Markdown = lambda text: ("markdown", text)
    display_module.Image = lambda filename: ("image", filename)
    display_module.display = shown.append
    ipython = types.ModuleType("IPython")
    ipython.display = display_module
    ipython.version_info = (9, 0)  # matplotlib reads it when IPython is imported
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display_module)
    return shown


def place_tiny_model(model_dir: str) -> None:
    """A tiny random Qwen2.5-architecture checkpoint (tied embeddings, Qwen's vocabulary) with
    the real Qwen tokenizer files, where the download cell would put the weights."""
    hf_models.build_tiny_checkpoint(model_dir, "qwen2_tied", vocab_size=151936, eos_token_id=151645)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copy(os.path.join(hf_models.qwen_tokenizer_dir(), name), model_dir)


def test_notebook_runs_on_cpu_with_a_tiny_model_and_a_reduced_budget(tmp_path, monkeypatch):
    nb = load_notebook()
    namespace: dict = {}
    exec(source(cell_tagged(nb, "parameters")), namespace)
    assert (namespace["MODEL"], namespace["USE_DRIVE"], namespace["BUDGET"]) == ("0.5b", False, "")
    namespace.update(PYTHON=sys.executable, LOCAL_DIR=str(tmp_path), BUDGET=REDUCED_BUDGET)

    # This CPU host is no TPU: the check stops the notebook with its one message.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    with pytest.raises(SystemExit, match="not a TPU v5e-1 or v6e-1 .*'cpu'"):
        exec(source(cell_tagged(nb, "check")), namespace)
    namespace["TARGET"] = "0.5b-v5e-1"

    exec(source(cell_tagged(nb, "paths")), namespace)
    workdir = namespace["WORKDIR"]
    assert namespace["MODEL_DIR"] == str(tmp_path / "models" / "0.5b")
    assert workdir == str(tmp_path / "runs" / "0.5b-v5e-1")
    place_tiny_model(namespace["MODEL_DIR"])

    commands = shell_lines(source(cell_tagged(nb, "run")), namespace)
    assert len(commands) == 1 and "run.py --config=configs/colab_tpu.py:0.5b-v5e-1" in commands[0]
    env = cpu_env(xla_flags=EXECUTION_BOUND_XLA_FLAGS)  # Qwen's vocabulary
    done = subprocess.run(
        commands[0], shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(os.path.join(workdir, "report.md")) as f:
        assert "before RL" in f.read()

    shown = stub_ipython(monkeypatch)
    exec(source(cell_tagged(nb, "show")), namespace)
    images = [os.path.basename(x) for kind, x in shown if kind == "image"]
    assert set(images) >= set(PLOTS)
    assert shown[0][0] == "markdown" and "| **mean** |" in shown[0][1]
    assert all(os.path.getsize(os.path.join(workdir, name)) > 0 for name in PLOTS)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

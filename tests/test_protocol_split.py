"""The BFCL split: the official SEAL release's ids by default, the project's seeded draw as an
option, followed by the task source, the config, the TFDS builder and the evaluation command."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from configs import qwen
from configs.base import VARIANTS, base_config
from environments.bfcl import all_task_ids, tfds_builder
from environments.bfcl.tasks import CATEGORIES, SPLIT_FILES, category_of, split_ids
from environments.sources import get_source
from seal_jax import config as config_lib
from tests.devices import REPO

# sha256 of the sorted ids, newline-joined, of the release's data/bfcl_train.parquet and
# data/bfcl_eval_400.parquet (field extra_info.index; github.com/yihaohu0118/SEAL), the files its
# exp/SEAL.yaml trains and validates on; shared/data/bfcl_release_split.json hashes the same.
RELEASE_DIGESTS = {
    "train": "7070e0154e15b3725e96304740caa3ff1a95d156450515266ec02cf8789fbdff",
    "eval": "8072554f60b5cdd258aa30be852beb6ef31be751c4c02846b69222389a673e12",
}
SHARED_FILE = Path("/work/shared/data/bfcl_release_split.json")  # where this machine has it


def digest(ids):
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def test_release_split_is_the_releases_ids_disjoint_and_per_category():
    train, evaluation = split_ids("train"), split_ids("eval")
    assert {"train": digest(train), "eval": digest(evaluation)} == RELEASE_DIGESTS
    assert (train[:3], evaluation[:3]) == (
        ["multi_turn_base_0", "multi_turn_base_2", "multi_turn_base_3"],
        ["multi_turn_base_4", "multi_turn_base_9", "multi_turn_base_21"],
    )
    assert len(set(train)) == len(set(evaluation)) == 400 and not set(train) & set(evaluation)
    assert sorted(train + evaluation) == sorted(all_task_ids())
    for part in (train, evaluation):
        assert sorted(category_of(i) for i in part) == sorted(list(CATEGORIES) * 100)
    # About half the seeded draw's training ids are the release's.
    assert len(set(train) & set(split_ids("train", "seeded"))) == 198


@pytest.mark.skipif(not SHARED_FILE.exists(), reason="the shared data folder is not here")
def test_release_split_is_the_shared_file_in_its_order():
    shared = json.loads(SHARED_FILE.read_text())
    assert {p: split_ids(p) for p in ("train", "eval")} == {p: shared[p] for p in ("train", "eval")}


def test_the_split_option_switches_the_task_source():
    seeded = json.loads(SPLIT_FILES["seeded"].read_text())
    for part in ("train", "eval"):
        assert get_source("bfcl").split_ids(part) == split_ids(part)  # the default: release
        assert digest(get_source("bfcl", "release").split_ids(part)) == RELEASE_DIGESTS[part]
        assert get_source("bfcl", "seeded").split_ids(part) == seeded[part]
    assert get_source("suite", "seeded").split_ids("eval") == get_source("suite").split_ids("eval")
    with pytest.raises(ValueError, match="unknown BFCL split 'paper'; use one of release, seeded"):
        get_source("bfcl", "paper")


def test_release_split_is_the_default_of_every_config():
    assert base_config().env.bfcl_split == "release"
    assert {qwen.get_config(v).env.bfcl_split for v in VARIANTS} == {"release"}
    c = base_config()
    c.env.bfcl_split = "seeded"
    config_lib.validate(c)
    c.env.bfcl_split = "paper"
    with pytest.raises(config_lib.ConfigError, match=r"env\.bfcl_split='paper'.*release, seeded"):
        config_lib.validate(c)


def test_tfds_builder_follows_the_split(tmp_path):
    for name, dataset in (("release", "bfcl_multi_turn"), ("seeded", "bfcl_multi_turn/seeded")):
        tfds_builder.build(str(tmp_path), name)
        expected = json.loads(SPLIT_FILES[name].read_text())
        for part in ("train", "eval"):
            source = tfds.data_source(dataset, split=part, data_dir=str(tmp_path))
            ids = [tfds_builder.decode(source[i]).task_id for i in range(len(source))]
            assert sorted(ids) == sorted(expected[part]), (name, part)


def evaluate(*flags):
    return subprocess.run(
        [sys.executable, "-m", "environments.bfcl.evaluate", "--policy=noop", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_evaluation_command_follows_the_split_flag(tmp_path):
    seeded = json.loads(SPLIT_FILES["seeded"].read_text())["train"][:2]
    flags = ("--split=train", "--limit=2", "--num_workers=1", f"--workdir={tmp_path}")
    done = evaluate(*flags, "--bfcl_split=seeded")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "transcripts.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == seeded
    assert json.loads((tmp_path / "metrics.json").read_text())["bfcl_split"] == "seeded"
    bad = evaluate(*flags, "--bfcl_split=paper")
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "bfcl_split" in bad.stderr

"""TFDS builder of the BFCL multi-turn tasks and their split, in array_record format.

One builder config per split of `environments.bfcl.tasks.SPLITS`: "release" (the official SEAL
release's, the default) and "seeded" (the project's own draw). Build once (no TensorFlow
needed), then read with `tfds.data_source`:

    python -m environments.bfcl.tfds_builder --data_dir=~/tensorflow_datasets [--bfcl_split=seeded]

    import tensorflow_datasets as tfds
    import environments.bfcl.tfds_builder  # registers "bfcl_multi_turn"
    source = tfds.data_source("bfcl_multi_turn", split="train", data_dir=...)  # release
    seeded = tfds.data_source("bfcl_multi_turn/seeded", split="train", data_dir=...)
    task = environments.bfcl.tfds_builder.decode(source[0])  # -> ToolTask

Each example holds the task id, its category, and the BFCL entry and possible answer as JSON,
so that `decode` rebuilds the ToolTask exactly as `environments.bfcl.load_task` does. Reading a
directory where the dataset was never built raises FileNotFoundError naming the command above
(TFDS would otherwise try to build it in TFRecord format, which needs TensorFlow).
"""

import json

import tensorflow_datasets as tfds
from absl import app, flags
from etils import epath

from environments.bfcl.tasks import (
    CATEGORIES,
    SPLITS,
    build_task,
    category_of,
    raw_entries,
    split_ids,
)
from environments.task import ToolTask

PARTS = ("train", "eval")
COMMAND = "python -m environments.bfcl.tfds_builder --data_dir={} --bfcl_split={}"


# Under `python -m` this file also runs as `__main__`: that copy of the class stays unregistered
# (TFDS looks a builder's metadata up through its module's package, which `__main__` is not), and
# the command runs the builder of `environments.bfcl.tfds_builder` (see the end of the file).
class BfclMultiTurn(tfds.core.GeneratorBasedBuilder, skip_registration=__name__ == "__main__"):
    """BFCL v3 multi-turn (800 tasks): 400 train / 400 eval, 100 train per category."""

    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {
        "1.0.0": "bfcl-eval 2026.3.23 multi-turn data; split seed 2605.",
        "1.1.0": "One config per split: release (the SEAL release's ids), seeded (seed 2605).",
    }
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=name) for name in SPLITS]  # first: default
    # TFDS would locate this file through `importlib_resources`, which is not installed.
    code_path = epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        """Describes the features: id, category, and the entry and answer as JSON text."""
        features = tfds.features.FeaturesDict(
            {
                "id": tfds.features.Text(),
                "category": tfds.features.Text(),
                "entry": tfds.features.Text(),
                "answer": tfds.features.Text(),
            }
        )
        return self.dataset_info_from_configs(features=features, supervised_keys=None)

    _building = False  # set by `build`: the only way the data gets prepared

    def download_and_prepare(self, **kwargs) -> None:  # noqa: ANN003 (TFDS's keyword arguments)
        """Prepares the data only when called by `build`; elsewhere (e.g. `tfds.data_source` on a
        directory never built) raises FileNotFoundError naming the command that builds it."""
        if not self._building and not self.data_path.exists():
            raise FileNotFoundError(
                f"bfcl_multi_turn/{self.builder_config.name} {self.version} is not built in "
                f"{self.data_dir_root}: run "
                f"`{COMMAND.format(self.data_dir_root, self.builder_config.name)}` first"
            )
        super().download_and_prepare(**kwargs)

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
        """One generator per split; nothing is downloaded (the data ships with bfcl-eval)."""
        return {part: self._generate_examples(part) for part in PARTS}

    def _generate_examples(self, part: str):  # noqa: ANN202 (a generator of (key, example))
        """Yields (task id, example) for every task of one part of this config's split."""
        wanted = set(split_ids(part, self.builder_config.name))
        for category in CATEGORIES:
            for entry, answer in raw_entries(category):
                if entry["id"] in wanted:
                    yield (
                        entry["id"],
                        {
                            "id": entry["id"],
                            "category": category_of(entry["id"]),
                            "entry": json.dumps(entry),
                            "answer": json.dumps(answer),
                        },
                    )


def decode(example: dict) -> ToolTask:
    """Rebuilds the ToolTask from one example read from the data source."""
    text = lambda value: value.decode() if isinstance(value, bytes) else value  # noqa: E731
    return build_task(json.loads(text(example["entry"])), json.loads(text(example["answer"])))


def build(data_dir: str, bfcl_split: str = SPLITS[0]) -> None:
    """Writes the dataset (array_record) of one split (`tasks.SPLITS`) into data_dir."""
    builder = BfclMultiTurn(data_dir=data_dir, config=bfcl_split, file_format="array_record")
    builder._building = True
    builder.download_and_prepare()


def main(argv: list[str]) -> None:
    """Builds the dataset of --bfcl_split into --data_dir."""
    del argv
    build(flags.FLAGS.data_dir, flags.FLAGS.bfcl_split)


if __name__ == "__main__":
    from environments.bfcl import tfds_builder  # the registered builder (see BfclMultiTurn)

    flags.DEFINE_string("data_dir", None, "TFDS data directory.", required=True)
    flags.DEFINE_enum("bfcl_split", SPLITS[0], list(SPLITS), "Which split to build.")
    app.run(tfds_builder.main)

"""Checkpoint export round trips through transformers, sharded files, and clear load errors."""

import json
import os
import shutil

import numpy as np
import pytest
import transformers

from seal_jax.models import CheckpointError, load_hf_checkpoint, save_hf_checkpoint
from tests import hf_models


def _read_json(path):
    with open(path) as f:
        return json.load(f)


def _write_json(path, data):
    with open(path, "w") as f:
        json.dump(data, f)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


@pytest.mark.parametrize("variant", list(hf_models.VARIANTS))
def test_export_then_transformers_load_reproduces_jax_logits(tiny_checkpoints, variant, tmp_path):
    path, torch_model = tiny_checkpoints[variant]
    model = load_hf_checkpoint(path)
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size)
    jax_logits = np.asarray(model.logits(ids, positions, mask))
    out = str(tmp_path / "export")
    save_hf_checkpoint(out, model.params, model.config, dtype="float32", tokenizer_dir=path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, local_files_only=True, attn_implementation="eager"
    ).eval()
    torch_logits = hf_models.torch_logits(reloaded, ids, positions, mask)
    valid = mask.astype(bool)
    assert np.abs(torch_logits[valid] - jax_logits[valid]).max() <= 1e-4
    assert reloaded.config.tie_word_embeddings == torch_model.config.tie_word_embeddings


def test_sharded_bf16_export_loads_in_both_directions(tiny_checkpoints, tmp_path):
    path, torch_model = tiny_checkpoints["qwen3"]
    model = load_hf_checkpoint(path)
    out = str(tmp_path / "sharded")
    save_hf_checkpoint(out, model.params, model.config, dtype="bfloat16", max_shard_bytes=40_000)
    index = _read_json(os.path.join(out, "model.safetensors.index.json"))
    assert len(set(index["weight_map"].values())) > 1
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size)
    ours = np.asarray(load_hf_checkpoint(out).logits(ids, positions, mask))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        out, local_files_only=True, attn_implementation="eager", dtype="float32"
    ).eval()
    reference = hf_models.torch_logits(theirs, ids, positions, mask)
    valid = mask.astype(bool)
    # Both sides now compute in float32 from the same bf16-rounded weights.
    assert np.abs(ours[valid] - reference[valid]).max() <= 1e-4


def test_transformers_sharded_checkpoint_loads(tiny_checkpoints, tmp_path):
    path, torch_model = tiny_checkpoints["qwen2_untied"]
    out = str(tmp_path / "hf_sharded")
    torch_model.save_pretrained(out, max_shard_size="30KB")
    assert os.path.isfile(os.path.join(out, "model.safetensors.index.json"))
    ids, positions, mask = hf_models.padded_batch(torch_model.config.vocab_size)
    expected = hf_models.torch_logits(torch_model, ids, positions, mask)
    got = np.asarray(load_hf_checkpoint(out).logits(ids, positions, mask))
    valid = mask.astype(bool)
    assert np.abs(got[valid] - expected[valid]).max() <= 1e-4


def _sharded_copy(tiny_checkpoints, tmp_path):
    out = str(tmp_path / "sharded")
    tiny_checkpoints["qwen2_untied"][1].save_pretrained(out, max_shard_size="30KB")
    weight_map = _read_json(os.path.join(out, "model.safetensors.index.json"))["weight_map"]
    return out, sorted(set(weight_map.values()))


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_hf_checkpoint(str(tmp_path / "nope"))


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        load_hf_checkpoint(str(tmp_path))


def test_missing_shard_names_file(tiny_checkpoints, tmp_path):
    out, files = _sharded_copy(tiny_checkpoints, tmp_path)
    os.remove(os.path.join(out, files[1]))
    with pytest.raises(CheckpointError, match=f"{files[1]}: weight file is missing"):
        load_hf_checkpoint(out)


def test_truncated_shard_names_file(tiny_checkpoints, tmp_path):
    out, files = _sharded_copy(tiny_checkpoints, tmp_path)
    victim = os.path.join(out, files[0])
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) - 100)
    with pytest.raises(CheckpointError, match=f"{files[0]}: truncated"):
        load_hf_checkpoint(out)


def test_shape_mismatch_names_tensor_and_file(tiny_checkpoints, tmp_path):
    out = _copy(tiny_checkpoints["qwen2_untied"][0], tmp_path / "c")
    cfg = _read_json(os.path.join(out, "config.json"))
    cfg["intermediate_size"] = 128
    _write_json(os.path.join(out, "config.json"), cfg)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor .*mlp.* has shape"):
        load_hf_checkpoint(out)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"model_type": "mistral"}, "model_type 'mistral' is not supported"),
        ({"model_type": "qwen2_moe"}, "model_type 'qwen2_moe' is not supported"),
        ({"num_experts": 8}, "mixture-of-experts"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "yarn"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unsupported_architecture_is_refused(tiny_checkpoints, tmp_path, edit, message):
    out = _copy(tiny_checkpoints["qwen2_untied"][0], tmp_path / "c")
    cfg = _read_json(os.path.join(out, "config.json"))
    cfg.update(edit)
    _write_json(os.path.join(out, "config.json"), cfg)
    with pytest.raises(CheckpointError, match=message):
        load_hf_checkpoint(out)


def test_corrupt_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_hf_checkpoint(str(tmp_path))

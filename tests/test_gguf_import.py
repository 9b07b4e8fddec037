"""The GGUF import (seal_jax/models/import_gguf.py) on tiny files: our dequantization against
the `gguf` package's reference on random blocks of every type, tiny llama / qwen2 / qwen3 files
written with gguf's own writer (and quantizer) against transformers loading the same file, the
tokenizer's pre-tokenizers against the real Qwen and Llama 3 tokenizer files, and bad input.
The real SmolLM2 file is tests/test_smollm2.py's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as reference_dequantize
from gguf.quants import quantize
from transformers import AutoModelForCausalLM, AutoTokenizer

from seal_jax.models import CheckpointError, load_hf_checkpoint
from seal_jax.models.gguf_dequant import SUPPORTED_TYPES, dequantize
from seal_jax.models.import_gguf import PRE_TOKENIZERS, import_gguf
from tests import hf_models

T = GGMLQuantizationType


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_dequantize_equals_the_gguf_reference_on_random_blocks(qtype):
    """Random bytes are every possible quant and scale bit pattern; blocks whose float16 scales
    are inf/nan are left out of the comparison (their products' nan/inf depend on the order)."""
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(int(qtype)).integers(0, 256, (6, 40 * block_bytes), np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 in the left-out blocks
        want = reference_dequantize(raw, qtype)
        got = dequantize(raw, qtype, (6, 40 * per_block))
    assert got.dtype == np.float32 and got.shape == want.shape
    finite = np.isfinite(want)
    assert finite.mean() > 0.8
    np.testing.assert_array_equal(got[finite], want[finite])


def test_dequantize_refuses_a_wrong_byte_count():
    with pytest.raises(ValueError, match="needs 68 bytes, has 67"):
        dequantize(np.zeros(67, np.uint8), T.Q8_0, (64,))


# ---- tiny files written with gguf's writer ---------------------------------------------------

# A byte-level vocabulary (the 256 byte symbols, a few merges) and ChatML's control tokens.
_BYTES = [chr(c) for c in range(0x21, 0x7F)] + [chr(c) for c in range(0xA1, 0xAD)]
_BYTES += [chr(c) for c in range(0xAE, 0x100)]
_BYTES += [chr(0x100 + i) for i in range(256 - len(_BYTES))]  # GPT-2's remaps
_MERGES = ["Ġ t", "h e", "Ġt he", "i n"]
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENS = _SPECIALS + _BYTES + [m.replace(" ", "") for m in _MERGES]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Tensor types of the tiny files, by GGUF name part: every type gguf can quantize to.
TYPES = {
    "token_embd": T.Q8_0,
    "output": T.Q5_1,
    "attn_q": T.Q4_0,
    "attn_k": T.Q4_1,
    "attn_v": T.Q5_0,
    "attn_output": T.F16,
    "ffn_gate": T.BF16,
    "ffn_up": T.Q8_0,
    "ffn_down": T.Q4_1,
}
_HF_TO_GGUF = {
    "embed_tokens": "token_embd",
    "lm_head": "output",
    "norm": "output_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "q_norm": "attn_q_norm",
    "k_norm": "attn_k_norm",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}
VARIANTS = {"llama": "llama", "qwen2_untied": "qwen2", "qwen3": "qwen3"}
# transformers' GGUF loader takes a Qwen3 head size of 128 (the real models') whatever the file
# says: its reference file has that size (the float file below has 24).
OVERRIDES = {"qwen3": {"head_dim": 128}}


def llama_cpp_permute(w, heads):
    """llama.cpp's converter's layout of llama q/k rows: within each head, the two rotary halves
    interleaved row by row."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def gguf_name(hf_name):
    parts = hf_name.split(".")
    if parts[1] == "layers":
        return f"blk.{parts[2]}.{_HF_TO_GGUF[parts[-2]]}.{parts[-1]}"
    return f"{_HF_TO_GGUF[parts[-2]]}.{parts[-1]}"


def write_gguf(path, model, arch, pre="qwen2", add_bos=False, types=TYPES):
    """Writes `model` (a transformers causal LM) as a GGUF file as llama.cpp's converter would."""
    c = model.config
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(_SPECIALS) + [1] * (len(TOKENS) - len(_SPECIALS)))
    w.add_token_merges(_MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(add_bos)
    w.add_chat_template(CHATML)
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        x = p.detach().float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            x = llama_cpp_permute(x, heads)
        out = gguf_name(name)
        qtype = types.get(out.split(".")[-2], T.F32) if x.ndim == 2 else T.F32
        if qtype in (T.F32, T.F64):
            w.add_tensor(out, x.astype(np.float64 if qtype == T.F64 else np.float32))
        else:
            w.add_tensor(out, quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """{variant: (gguf file, imported directory)} for llama, qwen2 and qwen3."""
    out = {}
    for i, (variant, arch) in enumerate(VARIANTS.items()):
        root = tmp_path_factory.mktemp(variant)
        model = hf_models.build_tiny_checkpoint(
            str(root / "hf"),
            variant,
            seed=i,
            vocab_size=len(TOKENS),
            eos_token_id=2,
            **OVERRIDES.get(variant, {}),
        )
        path = str(root / f"{variant}.gguf")
        write_gguf(path, model, arch, add_bos=arch == "llama")
        import_gguf(path, str(root / "imported"))
        out[variant] = (path, str(root / "imported"))
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_file_logits_equal_transformers_loading_the_gguf(tiny_files, variant):
    """transformers' own GGUF loader (its dequantization and reverse permutation) is the
    reference: the imported weights are its weights bit for bit, and the logits agree."""
    path, imported = tiny_files[variant]
    reference = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    ).eval()
    ours = AutoModelForCausalLM.from_pretrained(imported).eval()
    want_state = reference.state_dict()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, want_state[name]), name
    ids, positions, mask = hf_models.padded_batch(len(TOKENS))
    want = hf_models.torch_logits(reference, ids, positions, mask)
    got = np.asarray(load_hf_checkpoint(imported).logits(ids, positions, mask))
    real = mask.astype(bool)
    assert np.abs(got - want)[real].max() < 1e-4


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_a_float32_file_imports_as_the_original_checkpoint(tmp_path, variant):
    """Without quantization the import gives back the transformers checkpoint the file was made
    from, exactly: llama's q/k rows in Hugging Face's order, Qwen3's head size 24 (not
    hidden / heads) from the file's key length."""
    model = hf_models.build_tiny_checkpoint(
        str(tmp_path / "hf"), variant, vocab_size=len(TOKENS), eos_token_id=2
    )
    write_gguf(str(tmp_path / "f32.gguf"), model, VARIANTS[variant], types={})
    import_gguf(str(tmp_path / "f32.gguf"), str(tmp_path / "imported"))
    imported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "imported")).state_dict()
    original = model.state_dict()
    assert imported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(imported[name], tensor), name


def test_imported_files_describe_the_model(tiny_files):
    _, imported = tiny_files["llama"]
    config = json.loads(Path(imported, "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and not config["tie_word_embeddings"]
    assert (config["bos_token_id"], config["eos_token_id"], config["dtype"]) == (1, 2, "float32")
    assert json.loads(Path(imported, "generation_config.json").read_text()) == {
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    tok = AutoTokenizer.from_pretrained(imported)
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|im_start|>"
    # add_bos_token: the llama file's tokenizer opens every encoding with BOS.
    assert tok("in")["input_ids"] == [1, TOKENS.index("in")]
    # The ChatML template without tools got SmolLM2's tool convention in front.
    assert "<tool_call>[" in tok.chat_template and tok.chat_template.endswith(CHATML)
    _, qwen = tiny_files["qwen2_untied"]
    assert AutoTokenizer.from_pretrained(qwen)(" the")["input_ids"] == [TOKENS.index("Ġthe")]


def test_bfloat16_import_is_the_float32_one_rounded(tiny_files, tmp_path):
    path, imported = tiny_files["qwen3"]
    import_gguf(path, str(tmp_path / "bf16"), dtype="bfloat16")
    from seal_jax.models.safetensors_io import open_checkpoint

    f32, bf16 = open_checkpoint(imported), open_checkpoint(str(tmp_path / "bf16"))
    assert set(f32) == set(bf16)
    for name, f in f32.items():
        want = f.array(name).astype(bf16[name].array(name).dtype)
        np.testing.assert_array_equal(bf16[name].array(name), want)


@pytest.mark.parametrize(("pre", "directory"), [("qwen2", "qwen"), ("llama-bpe", "llama")])
def test_pre_tokenizers_are_the_real_tokenizer_files(pre, directory):
    """The imported Qwen2 / Llama 3 pre-tokenization is the one of the models' own files."""
    files = {"qwen": hf_models.qwen_tokenizer_dir, "llama": hf_models.llama_tokenizer_dir}
    real = json.loads(Path(files[directory](), "tokenizer.json").read_text())
    assert PRE_TOKENIZERS[pre] == (real["normalizer"], real["pre_tokenizer"])


# ---- bad input -------------------------------------------------------------------------------


def test_bad_input_is_refused_with_a_clear_error(tiny_files, tmp_path):
    path, imported = tiny_files["qwen3"]
    with pytest.raises(CheckpointError, match="exists and is not an empty directory"):
        import_gguf(path, imported)
    with pytest.raises(CheckpointError, match="no such file"):
        import_gguf(str(tmp_path / "none.gguf"), str(tmp_path / "a"))
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(200))
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        import_gguf(str(corrupt), str(tmp_path / "b"))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(Path(path).read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        import_gguf(str(truncated), str(tmp_path / "c"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.gguf", "truncated.gguf"]


def test_unsupported_architecture_and_quantization_type_are_named(tmp_path):
    model = hf_models.build_tiny_checkpoint(
        str(tmp_path / "hf"), "qwen2_tied", vocab_size=len(TOKENS), eos_token_id=2
    )
    gemma = str(tmp_path / "gemma.gguf")
    write_gguf(gemma, model, "gemma")
    with pytest.raises(CheckpointError, match="architecture 'gemma' is not supported"):
        import_gguf(gemma, str(tmp_path / "out"))
    f64 = str(tmp_path / "f64.gguf")
    write_gguf(f64, model, "qwen2", types={**TYPES, "ffn_up": T.F64})
    with pytest.raises(CheckpointError, match="blk.0.ffn_up.weight has quantization type F64"):
        import_gguf(f64, str(tmp_path / "out"))
    odd = str(tmp_path / "odd.gguf")
    write_gguf(odd, model, "qwen2", pre="gpt-4o")
    with pytest.raises(CheckpointError, match="pre-tokenizer 'gpt-4o' is not supported"):
        import_gguf(odd, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_command_line_prints_one_error_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "seal_jax.models.import_gguf", f"--gguf={tmp_path}/x.gguf",
         f"--out={tmp_path}/out"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {tmp_path}/x.gguf: no such file"

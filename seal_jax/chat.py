"""Token ids of chat messages, rendered once with the tokenizer's own chat template.

Token-in / token-out: an episode's training sequence is the prompt ids, then, turn by turn, the
ids the model sampled and the ids of the environment's messages (tool responses, the next user
message) exactly as they were appended to the live sequence. Decoded model text is never
re-tokenized and the conversation is never re-rendered, because re-tokenizing can change ids
and re-rendering can change earlier turns.

The Qwen3 `<think>` rule. Qwen3's template is not append-only: in non-thinking mode
(`enable_thinking=False`) every generation prompt ends with an empty `<think>\\n\\n</think>\\n\\n`
block that the model conditions on, but when the finished conversation is rendered again, earlier
assistant turns lose that block (only the last turn after the last user query keeps it). The
rule: each turn's generation prompt, empty think block included, stays in the training ids as the
model saw it; `apply_chat_template` of the whole conversation is not the training sequence.
Qwen2.5-style templates are append-only, and there the two coincide.

Environment ids are cut out of the template itself: the messages are rendered after a dummy
assistant turn and everything after that turn's end-of-turn token is kept, so the separators
(for Qwen `\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`) are the template's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_MARKER = "\u2063SEAL_TURN_MARKER\u2063"


class ChatFormat:
    """Renders prompts and environment messages to ids with a Hugging Face tokenizer."""

    def __init__(self, tokenizer: Any, end_of_turn: str = "<|im_end|>", **template_kwargs: Any):
        """Args: a tokenizer with a chat template, the text that closes an assistant turn, and
        extra template variables applied to every render (e.g. enable_thinking=False)."""
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn
        self.end_of_turn_id = tokenizer.convert_tokens_to_ids(end_of_turn)
        self.template_kwargs = template_kwargs
        if self.end_of_turn_id is None or self.end_of_turn_id == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no token {end_of_turn!r}")

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a model turn: the end-of-turn token and the tokenizer's EOS/pad token."""
        ids = [self.end_of_turn_id]
        for tok in (self.tokenizer.eos_token, "<|endoftext|>"):
            tid = self.tokenizer.convert_tokens_to_ids(tok) if tok else None
            if tid is not None and tid != self.tokenizer.unk_token_id and tid not in ids:
                ids.append(tid)
        return tuple(ids)

    def encode(self, text: str) -> list[int]:
        """Ids of text as the template would produce them (no BOS/EOS added)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render(
        self, messages: Sequence[dict], tools: Sequence[dict] | None = None, **kw: Any
    ) -> str:
        """The chat template's text for messages (template_kwargs and kw passed through)."""
        return self.tokenizer.apply_chat_template(
            list(messages), tools=tools, tokenize=False, **{**self.template_kwargs, **kw}
        )

    def prompt_ids(
        self, messages: Sequence[dict], tools: Sequence[dict] | None = None
    ) -> list[int]:
        """Ids of the opening messages (system, user), then the assistant generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def env_ids(self, messages: Sequence[dict], turn_closed: bool = True) -> list[int]:
        """Ids to append after a model turn: messages (role "tool" / "user" / "system"), then the
        generation prompt of the next assistant turn.

        Args:
          messages: environment messages, in order. Consecutive tool messages share one block.
          turn_closed: whether the model's turn ended with the end-of-turn token; if it did not
            (it hit max_new_tokens), the end-of-turn token is inserted first, as the template would.
        """
        dummy = [{"role": "user", "content": "."}, {"role": "assistant", "content": _MARKER}]
        text = self.render(dummy + list(messages), add_generation_prompt=True)
        cut = text.find(_MARKER + self.end_of_turn)
        if cut < 0:
            raise ValueError(
                f"the chat template does not end assistant turns with {self.end_of_turn!r}; "
                "pass the right end_of_turn"
            )
        tail = text[cut + len(_MARKER) + len(self.end_of_turn) :]
        return self.encode(tail if turn_closed else self.end_of_turn + tail)

    def turn_closed(self, sampled_ids: Sequence[int]) -> bool:
        """Whether a sampled reply ended with the end-of-turn token."""
        return bool(sampled_ids) and sampled_ids[-1] == self.end_of_turn_id

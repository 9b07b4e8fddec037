"""Token ids of chat messages, rendered once with a chat template (the tokenizer's own, or
this package's Llama 3.1 one).

Token-in / token-out: an episode's training sequence is the prompt ids, then, turn by turn, the
ids the model sampled and the ids of the environment's messages (tool responses, the next user
message) exactly as they were appended to the live sequence. Decoded model text is never
re-tokenized and the conversation is never re-rendered, because re-tokenizing can change ids
and re-rendering can change earlier turns.

The Qwen3 `<think>` rule. Qwen3's template is not append-only: in non-thinking mode
(`enable_thinking=False`) every generation prompt ends with an empty `<think>\\n\\n</think>\\n\\n`
block that the model conditions on, but when the finished conversation is rendered again, earlier
assistant turns lose that block (only the last turn after the last user query keeps it). Qwen3.5's
template does the same, except that every assistant turn after the last user query keeps its
think block (its generation prompt opens one always: `<think>\\n` when thinking, the empty block
when not); turns before that query lose it, reasoning included. The rule: each turn's generation
prompt, think block included, stays in the training ids as the model saw it; `apply_chat_template`
of the whole conversation is not the training sequence. Qwen2.5-style templates are append-only,
and there the two coincide.

Environment ids are cut out of the template itself: the messages are rendered after a dummy
assistant turn and everything after that turn's end-of-turn token is kept, so the separators
(for Qwen `\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`) are the template's
(a think block the template writes into the dummy turn lies before the cut).

Chat formats (CHAT_FORMATS, `chat_format`): `qwen` renders with the tokenizer's own template
and Qwen's tool format (JSON calls); `qwen35` with the tokenizer's own template and Qwen3.5's
tool format (`qwen_xml`: `<function=NAME>` / `<parameter=ARG>` calls, also Qwen3-Coder's);
`llama3` with this package's Llama 3.1 template (templates/llama31_tools.jinja: tool results in
the `ipython` role, turns ending in `<|eot_id|>`, or `<|eom_id|>` when the model ends its message
for a tool) and ToolACE's tool format (environments.toolcall); `smollm2` with the tokenizer's own
template as `seal_jax.models.import_gguf` writes it for a ChatML GGUF without a tools section
(templates/smollm2_tools.jinja: tool results as user `<tool_response>` messages) and SmolLM2's
tool format (one JSON list of calls in `<tool_call>[...]</tool_call>`). `auto` picks by the
tokenizer's special tokens and, between the ChatML formats, by its chat template
(`detect_chat_format`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

_MARKER = "\u2063SEAL_TURN_MARKER\u2063"
CHAT_FORMATS = ("auto", "qwen", "qwen35", "llama3", "smollm2")
LLAMA31_TEMPLATE = Path(__file__).parent / "templates" / "llama31_tools.jinja"


class ChatFormat:
    """Renders prompts and environment messages to ids with a Hugging Face tokenizer."""

    def __init__(
        self,
        tokenizer: Any,
        end_of_turn: str = "<|im_end|>",
        *,
        other_ends: Sequence[str] = (),
        tool_format: str = "qwen",
        chat_template: str | None = None,
        **template_kwargs: Any,
    ):
        """Args: a tokenizer, the text the template closes an assistant turn with, other tokens
        that also close one when the model samples them (`other_ends`), the tool format the
        environment shows and parses (environments.toolcall.TOOL_FORMATS), a chat template to
        render with instead of the tokenizer's own, and extra template variables applied to
        every render (e.g. enable_thinking=False)."""
        ends = (end_of_turn, *other_ends)
        missing = [token for token in ends if _token_id(tokenizer, token) is None]
        if missing:
            raise ValueError(f"the tokenizer has no token {missing[0]!r}")
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn
        self.end_of_turn_ids = tuple(_token_id(tokenizer, token) for token in ends)
        self.end_of_turn_id = self.end_of_turn_ids[0]
        self.tool_format = tool_format
        self.chat_template = chat_template
        self.template_kwargs = template_kwargs

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a model turn: the end-of-turn tokens and the tokenizer's EOS/pad token."""
        ids = list(self.end_of_turn_ids)
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
            list(messages),
            tools=tools,
            tokenize=False,
            chat_template=self.chat_template,
            **{**self.template_kwargs, **kw},
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
          turn_closed: whether the model's turn ended with an end-of-turn token; if it did not
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
        """Whether a sampled reply ended with an end-of-turn token."""
        return bool(sampled_ids) and sampled_ids[-1] in self.end_of_turn_ids


def _token_id(tokenizer: Any, token: str) -> int | None:
    """The id of `token` as one token of the tokenizer's vocabulary, or None."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    return None if token_id is None or token_id == tokenizer.unk_token_id else token_id


_FORMAT_TOKENS = ("<|im_end|>", "<|start_header_id|>", "<|eot_id|>")


def detect_chat_format(tokenizer: Any) -> str:
    """The chat format of a checkpoint's tokenizer, from its special tokens: with `<|im_end|>`,
    `qwen35` when its chat template writes `<function=` calls (Qwen3.5, Qwen3-Coder),
    `smollm2` when it writes `<tool_call>[` call lists (SmolLM2 as imported from a GGUF), else
    `qwen`; `llama3` with `<|start_header_id|>` and `<|eot_id|>`."""
    has = {token: _token_id(tokenizer, token) is not None for token in _FORMAT_TOKENS}
    if has["<|im_end|>"]:
        template = _template_text(tokenizer)
        if "<function=" in template:
            return "qwen35"
        return "smollm2" if "<tool_call>[" in template else "qwen"
    if has["<|start_header_id|>"] and has["<|eot_id|>"]:
        return "llama3"
    raise ValueError(
        "cannot tell the chat format from the tokenizer (no <|im_end|>, no Llama 3 header "
        f"tokens); set --config.model.chat_format to one of {', '.join(CHAT_FORMATS[1:])}"
    )


def _template_text(tokenizer: Any) -> str:
    """The text of the tokenizer's chat template(s); "" without one."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(template.values()) if isinstance(template, dict) else template


def chat_format(tokenizer: Any, name: str = "auto", **template_kwargs: Any) -> ChatFormat:
    """The ChatFormat `name` (CHAT_FORMATS; `auto`: `detect_chat_format`) for a checkpoint's
    tokenizer, with extra template variables for every render (e.g. enable_thinking=False)."""
    resolved = detect_chat_format(tokenizer) if name == "auto" else name
    if resolved == "qwen":
        return ChatFormat(tokenizer, **template_kwargs)
    if resolved == "qwen35":
        return ChatFormat(tokenizer, tool_format="qwen_xml", **template_kwargs)
    if resolved == "smollm2":
        return ChatFormat(tokenizer, tool_format="smollm2", **template_kwargs)
    if resolved == "llama3":
        return ChatFormat(
            tokenizer,
            "<|eot_id|>",
            other_ends=("<|eom_id|>",),
            tool_format="toolace",
            chat_template=LLAMA31_TEMPLATE.read_text(),
            **template_kwargs,
        )
    raise ValueError(f"chat format must be one of {', '.join(CHAT_FORMATS)}, got {name!r}")


def run_chat_format(tokenizer: Any, config: Any) -> ChatFormat:
    """The ChatFormat of a run: `config.model.chat_format`, its tool format unless
    `config.model.tool_format` names another (e.g. the release prompts Qwen3.5 with Qwen's JSON
    calls), and `config.rollout.enable_thinking` for every render."""
    fmt = chat_format(
        tokenizer, config.model.chat_format, enable_thinking=config.rollout.enable_thinking
    )
    if config.model.tool_format != "auto":
        fmt.tool_format = config.model.tool_format
    return fmt

"""Every string the agent sees comes from here: system prompt, user turns, reveals, tool results.

`Renderer` is the plain interface used for evaluation. The training-time learning interface
(schema cues, error hints, guidelines) wraps or subclasses it and overrides these methods.

Two prompt styles (PROMPT_STYLES):

* `release`: what the SEAL release shows a Qwen model (its `bfcl_qwen_fc` tool prompt) and
  BFCL's own QwenFCHandler shows too: the BFCL function docs as they are (BFCL type names, the
  `response` schema kept), one `json.dumps` line each, non-ASCII escaped. Held-back functions
  are handed over as the release does: their docs as one JSON list, then BFCL's sentence.
* `chat_template`: this project's earlier rendering, exactly what Qwen's chat template renders
  for `tools=`: OpenAI-style function wrappers with JSON Schema type names, no `response`.

The tool format (`tool_format`, environments.toolcall.TOOL_FORMATS) is the policy's: `qwen`
lists the tools as above, `qwen_xml` lists the same entries in Qwen3.5's tools section (before
the task text, as its chat template does), `toolace` in ToolACE's prompt
(toolcall.render_toolace_block), `smollm2` as one JSON list in SmolLM2's function-calling prompt
(after the task text, as the imported chat template puts it).
"""

import dataclasses
import json
from collections.abc import Sequence

from environments.executor import CallOutcome
from environments.toolcall import TOOL_FORMATS, function_tool, render_tools_block

Message = dict[str, str]
PROMPT_STYLES = ("release", "chat_template")

# BFCL's text for a turn that reveals held-back functions (DEFAULT_USER_PROMPT_FOR_ADDITIONAL_*).
REVEAL_SUFFIX = "I have updated some more functions you can choose from. What about now?"
# The release's prefix of the message answering a reply it rejected (release mode).
REJECTED_PREFIX = "[ERROR] Invalid tool call format: "

_ERROR_TEXTS = {
    "unparseable": "Error: could not parse the tool call: {reason}.",
    "unknown_tool": "Error: there is no tool named {tool!r} among the available tools.",
    "missing_argument": "Error: {tool}() is missing the required argument {argument!r}.",
    "unexpected_argument": "Error: {tool}() got an unexpected argument {argument!r}.",
    "wrong_type": "Error: argument {argument!r} of {tool}() must be of type {expected}, not {got}.",
    "enum_value": "Error: argument {argument!r} of {tool}() must be one of {allowed}.",
}


@dataclasses.dataclass(frozen=True)
class Renderer:
    """The plain interface: turns a task's facts into chat messages.

    Messages are `{"role": ..., "content": ...}` dicts; tool messages may also carry
    `error_kind`, a machine-readable label that chat templates ignore.

    Attributes:
      prompt_style: how tools are shown (PROMPT_STYLES, module docstring).
      tool_format: the call format the agent is told to write and is parsed with (TOOL_FORMATS).
    """

    prompt_style: str = dataclasses.field(default="chat_template", kw_only=True)
    tool_format: str = dataclasses.field(default="qwen", kw_only=True)

    def __post_init__(self) -> None:
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(
                f"prompt_style must be one of {PROMPT_STYLES}, got {self.prompt_style!r}"
            )
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {self.tool_format!r}")

    def tools(self, docs: list[dict]) -> list[dict]:
        """Returns the tool entries listed for these function docs (copies)."""
        if self.prompt_style == "release":
            return [dict(doc) for doc in docs]
        return [function_tool(doc) for doc in docs]

    def system(self, docs: list[dict], preamble: str = "") -> Message:
        """Returns the system message: optional task text, then the tools section (`qwen_xml`:
        the tools section first, where Qwen3.5's chat template puts it)."""
        release = self.prompt_style == "release"
        block = render_tools_block(self.tools(docs), release, self.tool_format)
        if not preamble:
            return {"role": "system", "content": block}
        parts = (block, preamble) if self.tool_format == "qwen_xml" else (preamble, block)
        return {"role": "system", "content": "\n\n".join(parts)}

    def user_turn(self, messages: list[dict]) -> list[Message]:
        """Returns the messages that open a user turn, copied from the task."""
        return [{"role": m["role"], "content": m["content"]} for m in messages]

    def reveal(self, docs: list[dict]) -> Message:
        """Returns the user message that hands over held-back functions (BFCL's wording)."""
        listing = json.dumps(self.tools(docs), ensure_ascii=False)
        return {"role": "user", "content": f"{listing}\n{REVEAL_SUFFIX}"}

    def tool_message(self, outcome: CallOutcome, shown_tools: Sequence[str] = ()) -> Message:
        """Returns the tool message for one call's outcome.

        `shown_tools` names the tools the agent can currently see (the plain interface does
        not use it; the learning interface lists them in its hints).
        """
        if outcome.result is not None:
            content = outcome.result
        else:
            content = _ERROR_TEXTS[outcome.error_kind].format(**outcome.details)
        message = {"role": "tool", "content": content}
        if outcome.error_kind:
            message["error_kind"] = outcome.error_kind
        return message

    def unparseable(self, reason: str) -> Message:
        """Returns the tool message answering a `<tool_call>` block that could not be parsed."""
        content = _ERROR_TEXTS["unparseable"].format(reason=reason)
        return {"role": "tool", "content": content, "error_kind": "unparseable"}

    def rejected(self, reason: str, error_kind: str) -> Message:
        """Returns the user message answering a reply whose calls were all rejected (release
        mode: `error_kind` "unparseable" or "unknown_tool"), in the release's words."""
        return {"role": "user", "content": REJECTED_PREFIX + reason, "error_kind": error_kind}

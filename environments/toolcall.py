"""The Qwen function-calling text format: tool schemas in, `<tool_call>` blocks out.

Parsing follows the official BFCL Qwen handler (`<tool_call>\\n{json}\\n</tool_call>`), and
additionally reports every block it could not use, so the environment can answer it with an
error observation instead of silently ignoring it. Model text is only ever `json.loads`-ed.
"""

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

# The exact pattern of BFCL's QwenFCHandler; anything else between the tags is unparseable.
TOOL_CALL_PATTERN = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
TOOL_CALL_OPEN = "<tool_call>"

QWEN_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
QWEN_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# The SEAL release's block pattern: a JSON object between the tags, newlines optional.
RELEASE_TOOL_CALL_PATTERN = re.compile(r"<tool_call>\s*\n?(\{.*?\})\s*\n?</tool_call>", re.DOTALL)

# BFCL's function docs use Python-flavoured type names; Qwen expects JSON Schema.
_JSON_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
# BFCL drops such a block alone; any other unusable block makes it drop the whole message.
_DROPPED_BLOCK_REASONS = ("invalid JSON", "tool call longer")
_MALFORMED_BLOCK = "expected <tool_call>, a newline, the JSON object, a newline, </tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One call: a tool name and its keyword arguments (positional ones only from ground truth)."""

    name: str
    arguments: dict[str, Any]
    positional: tuple[Any, ...] = ()


@dataclass
class ParsedReply:
    """What one assistant message asked for.

    `calls` are the well-formed calls; `invalid` holds one reason per `<tool_call>` block that
    could not be used. `official_calls` is what BFCL's own decoder would keep: it drops a
    block that is not JSON, and the whole message when a JSON block is not a call object.
    """

    calls: list[ToolCall] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    official_calls: list[ToolCall] = field(default_factory=list)


def to_json_schema(node: Any) -> Any:
    """Returns a copy of a BFCL parameter schema with JSON Schema type names."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: to_json_schema(value) for key, value in node.items()}
    if isinstance(converted.get("type"), str):
        converted["type"] = _JSON_SCHEMA_TYPES.get(converted["type"], converted["type"])
    return converted


def function_tool(doc: dict) -> dict:
    """Turns a function doc {name, description, parameters, ...} into a Qwen/OpenAI tool."""
    return {
        "type": "function",
        "function": {
            "name": doc["name"],
            "description": doc.get("description", ""),
            "parameters": to_json_schema(doc.get("parameters", {"type": "object"})),
        },
    }


def render_tools_block(tools: list[dict], ensure_ascii: bool = False) -> str:
    """Returns the Qwen system-prompt tools section: one JSON line per tool, non-ASCII kept as
    the chat template's `tojson` keeps it, or escaped (`ensure_ascii`) as BFCL's QwenFCHandler
    and the SEAL release write it."""
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=ensure_ascii) for tool in tools)
    return QWEN_TOOLS_HEADER + lines + QWEN_TOOLS_FOOTER


def _decode_block(block: str, max_chars: int) -> ToolCall | str:
    """Decodes one block's JSON into a call, or returns why it is unusable."""
    if len(block) > max_chars:
        return f"tool call longer than {max_chars} characters"
    try:
        item = json.loads(block)
    except (ValueError, RecursionError) as error:
        return f"invalid JSON ({error})"
    if not isinstance(item, dict) or "name" not in item or "arguments" not in item:
        return 'expected an object {"name": ..., "arguments": {...}}'
    arguments = item["arguments"]
    if isinstance(arguments, str):  # BFCL accepts arguments encoded as a JSON string.
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return "arguments must be a JSON object"
    if not isinstance(item["name"], str) or not isinstance(arguments, dict):
        return "name must be a string and arguments a JSON object"
    return ToolCall(item["name"], arguments)


def parse_reply(text: str, max_chars: int = 100_000) -> ParsedReply:
    """Parses an assistant message into tool calls, never executing any of its text.

    Args:
      text: the raw assistant message.
      max_chars: longest accepted JSON payload of one call (longer ones are invalid).
    Returns:
      ParsedReply with the usable calls, one reason per unusable block, and the calls the
      official BFCL decoder would keep.
    """
    reply = ParsedReply()
    blocks = TOOL_CALL_PATTERN.findall(text)
    unmatched_openings = max(text.count(TOOL_CALL_OPEN) - len(blocks), 0)
    structural_failure = False
    for block in blocks:
        decoded = _decode_block(block, max_chars)
        if isinstance(decoded, ToolCall):
            reply.calls.append(decoded)
        else:
            reply.invalid.append(decoded)
            structural_failure |= not decoded.startswith(_DROPPED_BLOCK_REASONS)
    reply.invalid += [_MALFORMED_BLOCK] * unmatched_openings
    if not structural_failure:
        reply.official_calls = list(reply.calls)
    return reply


def parse_release_reply(text: str) -> tuple[list[ToolCall], list[str]]:
    """Parses an assistant message as the SEAL release's strict parser does (its BFCL
    environment, `strict_tool_parser: true`); never executes any of its text.

    Differences from BFCL's decoder: whitespace around the JSON object may replace the
    newlines, and one unusable block (or `<tool_call>` text without any usable block) is an
    error that rejects the whole message instead of being dropped.

    Returns:
      (calls, errors): the calls in order, and one error text per problem found (the calls
      must not run when there is any). Error texts are the release's.
    """
    errors = []
    matches = RELEASE_TOOL_CALL_PATTERN.findall(text)
    if not matches and ("<tool_call" in text or "</tool_call>" in text):
        errors.append("Found tool_call tag text, but no valid <tool_call>{...}</tool_call> block.")
    calls = []
    for block in matches:
        try:
            item = json.loads(block.strip())
        except (ValueError, RecursionError) as error:
            errors.append(f"Invalid tool call JSON: {error}")
            continue
        if "name" not in item or "arguments" not in item:
            errors.append("Tool call JSON must contain both 'name' and 'arguments'.")
            continue
        name, arguments = item["name"], item["arguments"]
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                errors.append(f"Tool '{name}' has non-JSON string arguments.")
                continue
        if not isinstance(arguments, dict):
            errors.append(f"Tool '{name}' arguments must be a JSON object.")
            continue
        calls.append(ToolCall(str(name) if name else "", arguments))  # "": no name given
    return calls, errors


def render_tool_call(call: ToolCall) -> str:
    """Returns the `<tool_call>` block a Qwen model would write for `call`."""
    payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def parse_python_call(source: str) -> ToolCall:
    """Parses a ground-truth call string such as `cd(folder='x')` with `ast`, never `eval`.

    Raises:
      ValueError: `source` is not a single call of a plain name with literal arguments.
    """
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as error:
        raise ValueError(f"not a Python call: {source!r}") from error
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"expected name(args...), got {source!r}")
    if any(keyword.arg is None for keyword in node.keywords):
        raise ValueError(f"**kwargs are not allowed: {source!r}")
    try:
        positional = tuple(ast.literal_eval(arg) for arg in node.args)
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    except ValueError as error:
        raise ValueError(f"arguments must be literals: {source!r}") from error
    return ToolCall(node.func.id, arguments, positional)

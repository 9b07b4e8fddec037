"""The function-calling text formats (TOOL_FORMATS): tool schemas in, calls out.

* `qwen`: Qwen's format. Tools as JSON lines in `<tools></tools>`; calls as `<tool_call>` blocks.
  Parsing follows the official BFCL Qwen handler (`<tool_call>\\n{json}\\n</tool_call>`), and
  additionally reports every block it could not use, so the environment can answer it with an
  error observation instead of silently ignoring it. Model text is only ever `json.loads`-ed.
* `qwen_xml`: Qwen3.5's (and Qwen3-Coder's) format. Tools as JSON lines in `<tools></tools>`
  under another instruction; calls as `<tool_call>` blocks holding one `<function=NAME>` with one
  `<parameter=ARG>value</parameter>` per argument, written as the chat template writes them:
  strings as they are, lists and dicts as JSON, other values with Python's `str` (the template's
  `string` filter: `True`, `None`). A value is read back with its parameter's schema type when
  the tool's schema is known (strings raw, other types from JSON or those Python constants,
  never evaluated), else as JSON or a Python constant when it parses, else as the raw string.
* `toolace`: the BFCL prompt-mode format ToolACE (Llama 3.1) was trained on and the SEAL release
  prompts it with (its `toolace_official_prompt` mode): BFCL's default system prompt with the
  docs as an indented JSON list whose `parameters` are named `arguments`; calls as one Python
  list `[func(a=1, b="x")]`. Model text is only ever `ast.parse`-d, and only literal nodes of a
  whitelist become values: anything else makes the call unparseable, never evaluated.
* `smollm2`: SmolLM2-Instruct's format (the system prompt of SmolLM2-1.7B-Instruct's
  `instructions_function_calling.md`, the function-calling data it credits being Argilla's
  Synth-APIGen; ollama's smollm2 template renders the same): the tools as one JSON list in
  `<tools></tools>`; the calls of a reply as one JSON list in one block,
  `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>`, `[]` for no call; tool
  results come back in the user role as `<tool_response>\\n...\\n</tool_response>` (ollama's
  template; seal_jax/templates/smollm2_tools.jinja). Model text is only ever `json.loads`-ed.
"""

import ast
import json
import re
from collections.abc import Iterable, Mapping
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

# Qwen3.5's tools section (its chat template for `tools=`), around the same JSON lines.
QWEN_XML_TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
QWEN_XML_TOOLS_FOOTER = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)
# The formats that list tools as JSON lines: (text before the lines, text after them).
_JSON_LINE_SECTIONS = {
    "qwen": (QWEN_TOOLS_HEADER, QWEN_TOOLS_FOOTER),
    "qwen_xml": (QWEN_XML_TOOLS_HEADER, QWEN_XML_TOOLS_FOOTER),
}

TOOL_FORMATS = ("qwen", "toolace", "qwen_xml", "smollm2")

# SmolLM2's function-calling system prompt, around the tools' JSON list: the wording of
# instructions_function_calling.md in the SmolLM2-1.7B-Instruct repository (model data: the
# prompt the model was shown, kept exactly, trailing spaces included).
SMOLLM2_TOOLS_HEADER = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. \nBased on the question, you will need to make one or more function/tool calls "
    "to achieve the purpose. \nIf none of the functions can be used, point it out and refuse to "
    "answer. \nIf the given question lacks the parameters required by the function, also point "
    "it out.\n\nYou have access to the following tools:\n<tools>"
)
SMOLLM2_TOOLS_FOOTER = (
    "</tools>\n\nThe output MUST strictly adhere to the following format, and NO other text "
    "MUST be included.\nThe example format is as follows. Please make sure the parameter type is "
    "correct. If no function call is needed, please make the tool calls an empty list '[]'.\n"
    '<tool_call>[\n{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": '
    '"value2"}},\n... (more tool calls as required)\n]</tool_call>'
)
# How a `smollm2` reply may look: what an unusable block is told.
JSON_LIST_EXPECTED = (
    'expected <tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>: one JSON list of '
    "calls"
)
_JSON_LIST_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

# BFCL's default prompt-mode system prompt (bfcl_eval: `_DEFAULT_SYSTEM_PROMPT`) as the SEAL
# release shows it to ToolACE: without its multi-turn paragraph, a period after the format.
TOOLACE_TOOLS_HEADER = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls to "
    "achieve the purpose.\nIf none of the functions can be used, point it out. If the given "
    "question lacks the parameters required by the function, also point it out.\nYou should "
    "only return the function calls in your response.\n\nIf you decide to invoke any of the "
    "function(s), you MUST put it in the format of [func_name1(params_name1=params_value1, "
    "params_name2=params_value2...), func_name2(params)].\nYou SHOULD NOT include any other "
    "text in the response.\n\nHere is a list of functions in JSON format that you can invoke.\n"
)
# How a `toolace` call list may look: what an unusable one is told.
PYTHON_CALLS_EXPECTED = "expected one Python list of calls such as [func(arg=value)]"

# The SEAL release's block pattern: a JSON object between the tags, newlines optional.
RELEASE_TOOL_CALL_PATTERN = re.compile(r"<tool_call>\s*\n?(\{.*?\})\s*\n?</tool_call>", re.DOTALL)

# BFCL's function docs use Python-flavoured type names; Qwen expects JSON Schema.
_JSON_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
# BFCL drops such a block alone; any other unusable block makes it drop the whole message.
_DROPPED_BLOCK_REASONS = ("invalid JSON", "tool call longer")
_MALFORMED_BLOCK = "expected <tool_call>, a newline, the JSON object, a newline, </tool_call>"

# How a `qwen_xml` call may look: what an unusable block is told.
XML_CALL_EXPECTED = (
    "expected <tool_call>, <function=NAME>, <parameter=NAME>value</parameter> for each "
    "argument, </function>, </tool_call>"
)
TOOL_CALL_CLOSE = "</tool_call>"
_XML_FUNCTION = re.compile(r"<function=([^<>\s]+)>")
_XML_FUNCTION_CLOSE = "</function>"
_XML_PARAMETER = re.compile(r"\s*<parameter=([^<>\s]+)>(.*?)</parameter>", re.DOTALL)
# What the template's `string` filter writes for these values (Python's str), read back.
_PYTHON_CONSTANTS = {"True": True, "False": False, "None": None}
# The Python types of a JSON Schema (or BFCL, via _JSON_SCHEMA_TYPES) type other than string.
_XML_VALUE_TYPES = {
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


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
    BFCL has no decoder of the `qwen_xml` format; there they are the calls of a message whose
    blocks are all usable, else none (as for `toolace`: a message is decoded whole).
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


def render_tools_block(
    tools: list[dict], ensure_ascii: bool = False, tool_format: str = "qwen"
) -> str:
    """Returns the system-prompt tools section of `tool_format` (TOOL_FORMATS).

    qwen: one JSON line per tool, non-ASCII kept as the chat template's `tojson` keeps it, or
    escaped (`ensure_ascii`) as BFCL's QwenFCHandler and the SEAL release write it.
    qwen_xml: the same lines in Qwen3.5's section, exactly what its chat template writes for
    `tools=` between `<|im_start|>system\\n` and the system message's content.
    toolace: BFCL's prompt and the docs as the release lists them (`render_toolace_block`).
    smollm2: SmolLM2's prompt around the tools as one JSON list (non-ASCII as for qwen), what
    the imported chat template writes for `tools=` (seal_jax/templates/smollm2_tools.jinja).
    """
    if tool_format == "toolace":
        return render_toolace_block(tools)
    if tool_format == "smollm2":
        listing = json.dumps(tools, ensure_ascii=ensure_ascii)
        return SMOLLM2_TOOLS_HEADER + listing + SMOLLM2_TOOLS_FOOTER
    if tool_format not in _JSON_LINE_SECTIONS:
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
    header, footer = _JSON_LINE_SECTIONS[tool_format]
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=ensure_ascii) for tool in tools)
    return header + lines + footer


def render_toolace_block(tools: list[dict]) -> str:
    """Returns ToolACE's system prompt for `tools` (BFCL docs or OpenAI-style wrappers): name,
    description and the parameter schema under `arguments` (the key ToolACE expects), as one
    JSON list indented by 4, non-ASCII kept, as the SEAL release writes it."""
    entries = []
    for tool in tools:
        function = tool.get("function", tool)
        entry = {"name": function["name"], "description": function.get("description", "")}
        if function.get("parameters") is not None:
            entry["arguments"] = function["parameters"]
        entries.append(entry)
    return TOOLACE_TOOLS_HEADER + json.dumps(entries, ensure_ascii=False, indent=4) + "\n"


def _decode_block(block: str, max_chars: int) -> ToolCall | str:
    """Decodes one block's JSON into a call, or returns why it is unusable."""
    if len(block) > max_chars:
        return f"tool call longer than {max_chars} characters"
    try:
        item = json.loads(block)
    except (ValueError, RecursionError) as error:
        return f"invalid JSON ({error})"
    return _call_from_json(item)


def _call_from_json(item: Any) -> ToolCall | str:
    """A decoded JSON value as a call {"name": ..., "arguments": {...}}, or why it is not one."""
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


def parameter_schemas(docs: Iterable[dict]) -> dict[str, dict]:
    """The parameter schema of each function doc, by name: what `parse_reply` reads `qwen_xml`
    argument values with."""
    return {doc["name"]: doc.get("parameters", {}) for doc in docs}


def parse_reply(
    text: str,
    max_chars: int = 100_000,
    tool_format: str = "qwen",
    schemas: Mapping[str, dict] | None = None,
) -> ParsedReply:
    """Parses an assistant message into tool calls, never executing any of its text.

    Args:
      text: the raw assistant message.
      max_chars: longest accepted payload of one call (`toolace`: of one call list); longer
        ones are invalid.
      tool_format: the format the agent was told to write (TOOL_FORMATS).
      schemas: the parameter schema (a function doc's `parameters`) of each tool the agent
        was shown, by name; `qwen_xml` reads argument values with their types (the other
        formats write typed values themselves).
    Returns:
      ParsedReply with the usable calls, one reason per unusable block (`toolace`: per
      unusable call or list), and the calls the official BFCL decoder would keep.
    """
    if tool_format == "toolace":
        return parse_python_calls(text, max_chars)
    if tool_format == "qwen_xml":
        return parse_xml_calls(text, max_chars, schemas)
    if tool_format == "smollm2":
        return parse_json_list_calls(text, max_chars)
    if tool_format != "qwen":
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
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


def parse_release_reply(
    text: str, tool_format: str = "qwen", schemas: Mapping[str, dict] | None = None
) -> tuple[list[ToolCall], list[str]]:
    """Parses an assistant message as the SEAL release's strict parser does (its BFCL
    environment, `strict_tool_parser: true`); never executes any of its text.

    qwen: differences from BFCL's decoder: whitespace around the JSON object may replace the
    newlines, and one unusable block (or `<tool_call>` text without any usable block) is an
    error that rejects the whole message instead of being dropped. Error texts are the release's.
    toolace: `parse_python_calls`' calls and reasons (the release's ToolACE parser also keeps
    text around the list and rejects the whole message for any unusable call; unlike it, a
    non-literal argument is an error here, not its source text).
    qwen_xml: `parse_xml_calls`' calls and reasons, values typed by `schemas` (parse_reply);
    the release has no parser of this format.
    smollm2: `parse_json_list_calls`' calls and reasons (the release has no parser of it).

    Returns:
      (calls, errors): the calls in order, and one error text per problem found (the calls
      must not run when there is any).
    """
    if tool_format in ("toolace", "qwen_xml", "smollm2"):
        reply = parse_reply(text, tool_format=tool_format, schemas=schemas)
        return reply.calls, reply.invalid
    if tool_format != "qwen":
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
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


def render_tool_call(call: ToolCall, tool_format: str = "qwen") -> str:
    """Returns the `<tool_call>` block a model would write for `call` in `tool_format` (`qwen`,
    `qwen_xml` or `smollm2`: a list of the one call), as the chat template renders an
    assistant message's tool call. Blocks of one message are joined by a newline."""
    if tool_format == "smollm2":
        payload = json.dumps([{"name": call.name, "arguments": call.arguments}], ensure_ascii=False)
        return f"{TOOL_CALL_OPEN}{payload}{TOOL_CALL_CLOSE}"
    if tool_format == "qwen_xml":
        parameters = "".join(
            f"<parameter={name}>\n{_parameter_text(value)}\n</parameter>\n"
            for name, value in call.arguments.items()
        )
        return f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>"
    if tool_format != "qwen":
        raise ValueError(
            f"render_tool_call writes qwen, qwen_xml or smollm2 calls, not {tool_format!r}"
        )
    payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def _parameter_text(value: Any) -> str:
    """An argument as Qwen3.5's chat template writes it: dicts, lists and tuples with `tojson`
    (non-ASCII kept), anything else with the `string` filter (Python's str: `True`, `None`)."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def parse_json_list_calls(text: str, max_chars: int = 100_000) -> ParsedReply:
    """Parses a `smollm2` assistant message: each `<tool_call>...</tool_call>` block holds one
    JSON list of {"name": ..., "arguments": {...}} objects (arguments may be a JSON string of
    an object); `[]` is no call; text outside the blocks is ignored. Text is only ever
    `json.loads`-ed, never evaluated.

    Args:
      text: the raw assistant message.
      max_chars: longest accepted block; longer ones are invalid.
    Returns:
      ParsedReply with the usable calls, one reason per unusable block or list item (and one
      for an unclosed `<tool_call>`), and as `official_calls` the calls when everything is
      usable.
    """
    reply = ParsedReply()
    blocks = _JSON_LIST_BLOCK.findall(text)
    for block in blocks:
        if len(block) > max_chars:
            reply.invalid.append(f"tool call longer than {max_chars} characters")
            continue
        try:
            items = json.loads(block)
        except (ValueError, RecursionError) as error:
            reply.invalid.append(f"invalid JSON ({error}); {JSON_LIST_EXPECTED}")
            continue
        if not isinstance(items, list):
            reply.invalid.append(f"{JSON_LIST_EXPECTED}, not a {type(items).__name__}")
            continue
        for item in items:
            decoded = _call_from_json(item)
            (reply.calls if isinstance(decoded, ToolCall) else reply.invalid).append(decoded)
    if text.count(TOOL_CALL_OPEN) > len(blocks):
        reply.invalid.append("a <tool_call> block is not closed with </tool_call>")
    if not reply.invalid:
        reply.official_calls = list(reply.calls)
    return reply


def parse_xml_calls(
    text: str, max_chars: int = 100_000, schemas: Mapping[str, dict] | None = None
) -> ParsedReply:
    """Parses a `qwen_xml` assistant message: every `<tool_call>...</tool_call>` block holds
    one `<function=NAME>...</function>` with one `<parameter=ARG>\\nVALUE\\n</parameter>` per
    argument. Whitespace between the tags is free (newlines may be missing); exactly one
    leading and one trailing newline of a value are the format's and are dropped. Text is only
    ever scanned, `json.loads`-ed or looked up, never evaluated, in time linear in its length.

    Args:
      text: the raw assistant message.
      max_chars: longest accepted block; longer ones are invalid.
      schemas: the parameter schema of each shown tool, by name: its properties' types decide
        how values are read (`_xml_value`).
    Returns:
      ParsedReply with the usable calls, one reason per unusable block (one for all of an
      unclosed `<tool_call>` and what follows it), and as `official_calls` the calls when
      every block is usable.
    """
    reply = ParsedReply()
    position = text.find(TOOL_CALL_OPEN)
    if position < 0 and "<function=" in text:
        reply.invalid.append(XML_CALL_EXPECTED + "; a <function=...> outside <tool_call> tags")
    while position >= 0:
        start = position + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, start)
        if end < 0:
            reply.invalid.append("a <tool_call> block is not closed with </tool_call>")
            break
        decoded = _decode_xml_block(text[start:end], max_chars, schemas or {})
        (reply.calls if isinstance(decoded, ToolCall) else reply.invalid).append(decoded)
        position = text.find(TOOL_CALL_OPEN, end + len(TOOL_CALL_CLOSE))
    if not reply.invalid:
        reply.official_calls = list(reply.calls)
    return reply


def _decode_xml_block(block: str, max_chars: int, schemas: Mapping[str, dict]) -> ToolCall | str:
    """Decodes the inside of one `<tool_call>` block into a call, or returns why it is unusable."""
    if len(block) > max_chars:
        return f"tool call longer than {max_chars} characters"
    if TOOL_CALL_OPEN in block:
        return "a <tool_call> block inside another; close each with </tool_call>"
    body = block.strip()
    head = _XML_FUNCTION.match(body)
    if head is None or not body.endswith(_XML_FUNCTION_CLOSE):
        return XML_CALL_EXPECTED
    name = head.group(1)
    inner = body[head.end() : -len(_XML_FUNCTION_CLOSE)]
    if "<function=" in inner or _XML_FUNCTION_CLOSE in inner:
        return "expected one <function=NAME>...</function> in each <tool_call> block"
    parameters = schemas.get(name)
    properties = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
    arguments: dict[str, Any] = {}
    position = 0
    while match := _XML_PARAMETER.match(inner, position):
        argument, value = match.groups()
        if "<parameter=" in value:
            return f"{name}(): <parameter={argument}> is not closed with </parameter>"
        if argument in arguments:
            return f"{name}(): argument {argument!r} is given twice"
        value = value.removeprefix("\n").removesuffix("\n")
        arguments[argument] = _xml_value(value, properties.get(argument))
        position = match.end()
    rest = inner[position:].strip()
    if rest.startswith("<parameter="):
        return f"{name}(): a <parameter=...> is not closed with </parameter>"
    if rest:
        return f"{name}(): unexpected text {_excerpt(rest)}; {XML_CALL_EXPECTED}"
    return ToolCall(name, arguments)


def _xml_value(text: str, schema: Any) -> Any:
    """One argument's value from its text, by its parameter schema's type: the inverse of the
    template's rendering (strings as they are, Python's `str` of None, booleans and numbers,
    `tojson` of lists and dicts). `None` is no value (None) for every type; otherwise a string
    parameter's value is the text; any other type's is the JSON value or Python constant
    (`True`, `False`) when the text is one of that type, else the text itself, which the
    environment then refuses as the wrong type (as vLLM's qwen3_coder parser, a value never
    makes a block unusable). Without a schema type (unknown parameter, `any`, a union): JSON or
    a constant when the text parses, else the text."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    kind = _JSON_SCHEMA_TYPES.get(kind, kind) if isinstance(kind, str) else None
    if text == "None":
        return None
    if kind == "string":
        return text
    try:
        value = _PYTHON_CONSTANTS[text] if text in _PYTHON_CONSTANTS else json.loads(text)
    except (ValueError, RecursionError):
        return text
    types = _XML_VALUE_TYPES.get(kind)
    return value if value is None or types is None or type(value) in types else text


def _excerpt(text: str, limit: int = 40) -> str:
    """`text` quoted for an error message, cut after `limit` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


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


def parse_python_calls(text: str, max_chars: int = 100_000) -> ParsedReply:
    """Parses a `toolace` assistant message (`[func(a=1, b="x"), g()]`) with `ast`, never
    evaluating any of its text.

    Every top-level `[...]` span holding a call is a call list (text around it is allowed, as
    the release allows it); a reply that is one bare call `func(...)` is a list of it (BFCL adds
    the brackets). A reply without any, but that opens with `[` or `{` or holds `<tool_call>`,
    is unparseable; other text is a reply without calls. Arguments must be keyword arguments
    with literal values (`python_literal`).

    Returns:
      ParsedReply with the usable calls, one reason per unusable call or list, and as
      `official_calls` the calls when the whole reply is one clean list (BFCL decodes the
      whole reply; any problem leaves it no call).
    """
    reply = ParsedReply()
    body = text.strip("`\n ")  # what BFCL's decoder strips
    spans = _call_list_spans(body)
    if not spans and _BARE_CALL.fullmatch(body):
        spans = [body]
    if not spans:
        if "<tool_call" in body:
            reply.invalid.append(PYTHON_CALLS_EXPECTED + ", not <tool_call> tags")
        elif body.startswith(("[", "{")) and body != "[]":
            reply.invalid.append(PYTHON_CALLS_EXPECTED)
        return reply
    for span in spans:
        for decoded in _decode_call_list(span, max_chars):
            if isinstance(decoded, ToolCall):
                reply.calls.append(decoded)
            else:
                reply.invalid.append(decoded)
    if not reply.invalid and spans == [body]:
        reply.official_calls = list(reply.calls)
    return reply


# A reply that is a single call without the brackets: a name, then parentheses to the end.
_BARE_CALL = re.compile(r"[A-Za-z_]\w*\(.*\)", re.DOTALL)


def _call_list_spans(text: str) -> list[str]:
    """The top-level `[...]` spans of text that hold a call (a `(`). Quotes count only inside
    brackets, so an apostrophe in the prose around a list does not hide it."""
    spans, depth, start, quote, escaped = [], 0, 0, None, False
    for i, char in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "'\"" and depth:
            quote = char
        elif char == "[":
            start = i if depth == 0 else start
            depth += 1
        elif char == "]" and depth:
            depth -= 1
            if depth == 0 and "(" in text[start:i]:
                spans.append(text[start : i + 1])
    return spans


def _decode_call_list(span: str, max_chars: int) -> list[ToolCall | str]:
    """The calls of one call list (or bare call), or the reasons they are unusable."""
    if len(span) > max_chars:
        return [f"tool call longer than {max_chars} characters"]
    try:
        node = ast.parse(span, mode="eval").body
    except SyntaxError as error:
        return [f"invalid Python syntax ({error.msg})"]
    except (ValueError, RecursionError, MemoryError) as error:  # null bytes, huge ints, depth
        return [f"invalid Python syntax ({type(error).__name__})"]
    if isinstance(node, ast.Call):
        return [_decode_python_call(node)]
    if not isinstance(node, ast.List):
        return [PYTHON_CALLS_EXPECTED]
    return [_decode_python_call(item) for item in node.elts]


def _decode_python_call(node: ast.AST) -> ToolCall | str:
    """One list item as a call with keyword literal arguments, or why it is unusable."""
    if not isinstance(node, ast.Call):
        return PYTHON_CALLS_EXPECTED + "; an item is not a call"
    if not isinstance(node.func, ast.Name):
        return "a call must name a function directly, as func(arg=value)"
    name = node.func.id
    if node.args:
        return f"{name}(): give every argument by name (arg=value), not by position"
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return f"{name}(): **kwargs are not allowed"
        if keyword.arg in arguments:  # the parser lets it through (Python refuses it later)
            return f"{name}(): argument {keyword.arg!r} is given twice"
        try:
            arguments[keyword.arg] = python_literal(keyword.value)
        except ValueError:
            return (
                f"{name}(): argument {keyword.arg!r} must be a literal (a string, number, "
                "True/False/None, or a list, tuple or dict of them)"
            )
    return ToolCall(name, arguments)


def python_literal(node: ast.AST) -> Any:
    """The value of a literal expression node: str, int, float, bool or None constants, a sign
    before a number, and lists, tuples and dicts (constant keys) of literals.

    Raises:
      ValueError: any other node (names, calls, operators, comprehensions, f-strings, ...).
    """
    if isinstance(node, ast.Constant) and _is_scalar(node.value):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float)
    ):
        value = node.operand.value
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List):
        return [python_literal(item) for item in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(python_literal(item) for item in node.elts)
    if isinstance(node, ast.Dict):
        keys = node.keys
        if not all(isinstance(k, ast.Constant) and _is_scalar(k.value) for k in keys):
            raise ValueError("dict keys must be constants")
        return {k.value: python_literal(v) for k, v in zip(keys, node.values)}
    raise ValueError(f"not a literal: {type(node).__name__}")


def _is_scalar(value: Any) -> bool:
    """Whether a constant is a JSON-like scalar (not bytes, complex or Ellipsis)."""
    return value is None or type(value) in (bool, int, float, str)

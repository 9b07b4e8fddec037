"""The learning interface Omega_t: what the agent is shown during training (docs/method.md s. 4).

`observation = base observation (+) schema/affordance cues (+) error hints (+) guidelines`.
Four switches in `config.interface` (one per component; schema and affordance cues together
form the paper's first component), each "off", "static" (every unit, every step) or "adaptive"
(the closed loop below):

* `schema_cues`, per tool: each parameter's description gains the required marker, the
  allowed values of an enum and, with `schema_types`, the type; the system prompt gains one
  instruction line when a tool it lists is cued. The wording follows the renderer's prompt
  style: `release`, the SEAL release's (`desc [required] Allowed values: a, b`, types as
  `[type: dict]`, RELEASE_INSTRUCTION; held-back functions handed over later are not cued, as
  the release cues only the opening tool list), or `chat_template`, this project's earlier
  one (`[required] desc Allowed values: a, b.`, `Type: object.`, INSTRUCTION; reveals cued).
* `affordance_cues`, per tool: the tool's description gains a line urging its use.
* `error_hints`, per error kind: the error observation gains one actionable line. Hints are
  built from the schema, the shown tool names and fixed text only, never from the task's
  ground truth (there is no path from it to here) nor by echoing the model's own text.
* `guidelines`, per tag: one behavioural line per qualifying tag, appended to the system prompt.

Closed-loop update, once per training step (`LearningInterface.update`), from the step's
episodes and the aggregated tag statistics C_t:

    n(u) = turns of this step showing the failure behind unit u:
           schema cue for tool x      <- turns where a call to x broke its schema
                                         (the `argument_mismatch` cause, attributed to tools)
           affordance cue for tool x  <- turns with `missing_tool_call` that never ran x
           hint for error kind k      <- turns with `recovery_failure` that got a k error
    e(u) <- decay * e(u) + n(u)                                  (decayed evidence)
    u switches on when e(u) >= on_count, and off again when e(u) < off_count (hysteresis)
    guidelines: tags with a guideline text, count >= guideline_min_count, prevalence
           (count / non-excluded tag count, pass included) >= guideline_min_prevalence and mean
           episode reward < guideline_max_reward; the top guideline_top_k by
           prevalence * (1 - mean reward), ties by name. C_t is the failure profile's tag summary
           (`environments.profile`, its epoch window), which the weighting reads too.
    version += 1 whenever an active set changes.

Defaults (configs/base.py): decay 0.5, on_count 3, off_count 1, so a failure seen in 3 turns
of one step (or steadily in more than 1.5 turns per step) switches its unit on, a unit that
just reached e = 3 switches off after 2 quiet steps, and one at e stays on for about
log2(e) quiet steps; guideline thresholds 8 / 0.10 / 0.6 / top 3 as in the paper.

Presets (`configs.base.INTERFACE_PRESETS`): "released" (the authors' setting: static schema
cues on every tool, required and enum markers and the instruction line, nothing else),
"closed_loop" (every component adaptive) and "plain" (nothing). Evaluation renders the plain
interface whatever the state (`LearningInterface.renderer(evaluation=True)`). The state is plain
JSON-able data (`to_dict` / `from_dict`) and sent to the pool's workers inside a picklable
`InterfaceRenderer`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from environments.diagnosis import EXCLUDED_TAGS
from environments.episode import EpisodeResult
from environments.executor import CallOutcome
from environments.profile import FailureProfile
from environments.rendering import Message, Renderer
from environments.toolcall import to_json_schema

COMPONENTS = ("schema_cues", "affordance_cues", "error_hints", "guidelines")
EVIDENCE_COMPONENTS = COMPONENTS[:3]  # guidelines are chosen from C_t directly
MODES = ("off", "static", "adaptive")
INSTRUCTION = (
    "Parameters marked [required] must always be given; no tool exists beyond those listed "
    "in <tools></tools>."
)
# The release's instruction line (its observation_lite default), for the "release" style.
RELEASE_INSTRUCTION = (
    "Observation note: parameters marked [required] must be provided exactly when calling a "
    "tool; do not invent tools outside the current schema."
)
AFFORDANCE_CUE = (
    "Call this tool whenever the request needs what it does, also as a step before other calls."
)
# The "unparseable" hint in the `toolace` tool format (environments.toolcall.TOOL_FORMATS).
TOOLACE_FORMAT_HINT = (
    'Write the calls as one Python list, e.g. [func(arg="value")], every argument by name with '
    "a literal value (string, number, True/False/None, list or dict)."
)
# The "unparseable" hint in the `qwen_xml` tool format (Qwen3.5's chat template).
QWEN_XML_FORMAT_HINT = (
    "Write each call as <tool_call>, a newline, <function=NAME>, then for each argument "
    "<parameter=ARGUMENT>, the value on its own line, </parameter>, then </function> and "
    "</tool_call>, each tag on its own line."
)
# The "unparseable" hint in the `smollm2` tool format (SmolLM2's function-calling prompt).
SMOLLM2_FORMAT_HINT = (
    'Write all calls as one JSON list in one block: <tool_call>[{{"name": <function-name>, '
    '"arguments": <args-json-object>}}, ...]</tool_call>, in valid JSON.'
)
# The "unparseable" hint of each tool format other than Qwen's one JSON object per block.
FORMAT_HINTS = {
    "toolace": TOOLACE_FORMAT_HINT,
    "qwen_xml": QWEN_XML_FORMAT_HINT,
    "smollm2": SMOLLM2_FORMAT_HINT,
}
HINTS = {
    "unparseable": (
        'Write each call as <tool_call>, a newline, {{"name": <function-name>, "arguments": '
        "<args-json-object>}} in valid JSON, a newline, </tool_call>."
    ),
    "unknown_tool": (
        "Available tools: {tools}. If no tool fits the request, answer in plain text instead."
    ),
    "missing_argument": (
        "Call {tool}() again with all its required arguments, including {argument!r}."
    ),
    "unexpected_argument": "Call {tool}() again with only the parameters its schema lists.",
    "wrong_type": "Call {tool}() again with {argument!r} given as a JSON {expected}.",
    "enum_value": (
        "Call {tool}() again with {argument!r} set to one of the allowed values, exactly as "
        "written."
    ),
    "not_found": (
        "Inspect the current state first (list or look up what exists), then use a name or "
        "identifier that exists."
    ),
    "auth_required": "Authenticate or log in with the matching tool first, then repeat the call.",
    "tool_error": (
        "Read the error, fix the arguments or the order of the calls and retry; if no tool "
        "fits, answer in plain text."
    ),
    "timeout": "Retry with a simpler call, or answer in plain text if no tool fits.",
}
GUIDELINES = {
    "spurious_tool_call": (
        "If no available function matches the request, answer in plain text instead of "
        "inventing a call."
    ),
    "empty_turn_model_response": (
        "When the available functions can carry out the request, call them instead of only "
        "replying in text."
    ),
    "instance_mismatch": "Use the functions of the service the request is about, and only those.",
    "state_mismatch": (
        "Carry out every change the request asks for, with the exact names and values it gives, "
        "and check each result before the next call."
    ),
    "response_mismatch": (
        "When the user asks for information, call the function that returns it, even if nothing "
        "needs to change."
    ),
}


@dataclasses.dataclass(frozen=True)
class InterfaceRenderer(Renderer):
    """The training interface: the plain `Renderer` plus the active cues, hints and guidelines.

    Plain picklable data (sent to the pool's workers). A unit (tool, error kind, tag) is shown
    when its component's mode is "static", or "adaptive" and the unit is in `active`.

    Attributes:
      modes: component -> "off" | "static" | "adaptive", for every name in COMPONENTS.
      active: component -> active units; guidelines in rank order.
      schema_types: schema cues also name each parameter's type.
      prompt_style: the plain rendering and the cue wording (rendering.PROMPT_STYLES; keyword).
    """

    modes: Mapping[str, str]
    active: Mapping[str, Sequence[str]]
    schema_types: bool = False

    def shows(self, component: str, unit: str) -> bool:
        """Whether `unit` (a tool, error kind or tag) of `component` is shown."""
        mode = self.modes[component]
        return mode == "static" or (mode == "adaptive" and unit in self.active[component])

    def guidelines(self) -> list[str]:
        """Returns the guideline lines shown, in order."""
        if self.modes["guidelines"] == "static":
            return list(GUIDELINES.values())
        if self.modes["guidelines"] == "adaptive":
            return [GUIDELINES[tag] for tag in self.active["guidelines"]]
        return []

    def tools(self, docs: list[dict]) -> list[dict]:
        """Returns the tool schemas with the cues of each cued tool."""
        return super().tools([self._cued_doc(doc) for doc in docs])

    def system(self, docs: list[dict], preamble: str = "") -> Message:
        """Returns the plain system message plus the instruction line and guidelines."""
        message = super().system(docs, preamble)
        release = self.prompt_style == "release"
        blocks = []
        if any(self.shows("schema_cues", d["name"]) for d in docs):
            # INSTRUCTION names Qwen's <tools></tools>; ToolACE's prompt gets the release's line.
            generic = release or self.tool_format == "toolace"
            blocks.append(RELEASE_INSTRUCTION if generic else INSTRUCTION)
        guidelines = self.guidelines()
        if guidelines:
            blocks.append("\n".join(["Guidelines:"] + [f"- {line}" for line in guidelines]))
        if blocks:  # the release separates its extra instructions by a blank line
            message["content"] += "\n\n" + ("\n\n" if release else "\n").join(blocks)
        return message

    def reveal(self, docs: list[dict]) -> Message:
        """Returns the hand-over of held-back functions, cued in the chat_template style only
        (the release annotates only the opening tool list)."""
        if self.prompt_style == "release":
            return Renderer(prompt_style="release").reveal(docs)
        return super().reveal(docs)

    def tool_message(self, outcome: CallOutcome, shown_tools: Sequence[str] = ()) -> Message:
        """Returns the plain tool message, plus a hint line when its error kind has one."""
        message = super().tool_message(outcome, shown_tools)
        tools = ", ".join(shown_tools) or "none"
        return self._with_hint(message, {"tools": tools, **outcome.details})

    def unparseable(self, reason: str) -> Message:
        """Returns the plain unparseable-call message, plus the format hint when shown."""
        return self._with_hint(super().unparseable(reason), {})

    def _with_hint(self, message: Message, details: Mapping[str, Any]) -> Message:
        """Appends the hint of the message's error kind, if that kind's hint is shown."""
        kind = message.get("error_kind")
        if kind and self.shows("error_hints", kind):
            hint = HINTS[kind]
            if kind == "unparseable":
                hint = FORMAT_HINTS.get(self.tool_format, hint)
            message["content"] += "\nHint: " + hint.format(**details)
        return message

    def _cued_doc(self, doc: dict) -> dict:
        """Returns `doc` with its schema and affordance cues (a copy; `doc` is untouched)."""
        schema = self.shows("schema_cues", doc["name"])
        affordance = self.shows("affordance_cues", doc["name"])
        if not (schema or affordance):
            return doc
        doc = copy.deepcopy(doc)
        if affordance:
            doc["description"] = _join(doc.get("description", ""), AFFORDANCE_CUE)
        if schema:
            parameters = doc.get("parameters", {})
            required = set(parameters.get("required", []))
            for name, spec in parameters.get("properties", {}).items():
                cue = self._parameter_cue(spec, name in required)
                if cue != spec.get("description", ""):
                    spec["description"] = cue
        return doc

    def _parameter_cue(self, spec: dict, required: bool) -> str:
        """Returns a parameter's description with its required, type and enum cues."""
        description, enum = spec.get("description", ""), spec.get("enum")
        if self.prompt_style == "release":  # markers appended, none repeated, no final period
            marks = ["[required]"] if required and "[required]" not in description else []
            if self.schema_types and spec.get("type") and "[type:" not in description:
                marks.append(f"[type: {spec['type']}]")
            if enum and "Allowed values:" not in description:
                marks.append("Allowed values: " + ", ".join(map(str, enum)))
            return _join(description, *marks)
        text = _join("[required]" if required else "", description)
        if self.schema_types and "type" in spec:
            text = _join(text, f"Type: {to_json_schema(spec)['type']}.")
        if "enum" in spec:
            text = _join(text, "Allowed values: " + ", ".join(map(str, enum)) + ".")
        return text


def _join(*parts: str) -> str:
    """Joins the non-empty parts with single spaces."""
    return " ".join(part for part in parts if part)


@dataclasses.dataclass
class InterfaceState:
    """What the closed loop has learned; plain data.

    Attributes:
      step: updates applied so far.
      version: bumped whenever an active set changes.
      evidence: component (EVIDENCE_COMPONENTS) -> unit -> decayed evidence e(u).
      active: component (COMPONENTS) -> active units (sorted; guidelines in rank order).
    """

    step: int = 0
    version: int = 0
    evidence: dict[str, dict[str, float]] = dataclasses.field(
        default_factory=lambda: {c: {} for c in EVIDENCE_COMPONENTS}
    )
    active: dict[str, list[str]] = dataclasses.field(
        default_factory=lambda: {c: [] for c in COMPONENTS}
    )

    def to_dict(self) -> dict[str, Any]:
        """Returns the state as JSON-able data (a deep copy)."""
        return copy.deepcopy(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InterfaceState:
        """Rebuilds a state written by `to_dict`; raises ValueError on anything malformed."""
        try:
            state = cls(
                step=_count(data["step"]),
                version=_count(data["version"]),
                evidence={
                    c: {str(u): float(e) for u, e in data["evidence"][c].items()}
                    for c in EVIDENCE_COMPONENTS
                },
                active={c: [_name(u) for u in data["active"][c]] for c in COMPONENTS},
            )
            unknown = (set(data) - {"step", "version", "evidence", "active"}) | (
                (set(data["evidence"]) - set(EVIDENCE_COMPONENTS))
                | (set(data["active"]) - set(COMPONENTS))
            )
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)}")
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(
                f"malformed interface state ({type(error).__name__}: {error}); expected the "
                "dict written by InterfaceState.to_dict()"
            ) from error
        return state


def _count(value: Any) -> int:
    """A non-negative int, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def _name(value: Any) -> str:
    """A string, else ValueError."""
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def step_evidence(episodes: Sequence[EpisodeResult]) -> dict[str, Counter]:
    """Returns n(u) per evidence component: the step's turns showing each unit's failure."""
    counts = {c: Counter() for c in EVIDENCE_COMPONENTS}
    for episode in episodes:
        turns = zip(
            episode.turn_causes,
            episode.turn_error_kinds,
            episode.turn_argument_tools,
            episode.turn_missing_tools,
        )
        for causes, kinds, argument_tools, missing_tools in turns:
            counts["schema_cues"].update(set(argument_tools))
            if "missing_tool_call" in causes:
                counts["affordance_cues"].update(set(missing_tools))
            if "recovery_failure" in causes:
                counts["error_hints"].update(set(kinds))
    return counts


def select_guidelines(
    summary: Mapping[str, tuple[int, float]],
    *,
    min_count: int,
    min_prevalence: float,
    max_reward: float,
    top_k: int,
    excluded_tags: Sequence[str],
) -> list[str]:
    """Returns the tags whose guideline is shown, best first (see the module docstring).

    Args:
      summary: tag -> (count, mean episode reward), as `FailureProfile.tags.summary()` returns.
    """
    total = sum(count for tag, (count, _) in summary.items() if tag not in excluded_tags)
    ranked = []
    for tag, (count, mean_reward) in summary.items():
        if tag not in GUIDELINES or tag in excluded_tags or count < min_count:
            continue
        prevalence = count / total
        if prevalence >= min_prevalence and mean_reward < max_reward:
            ranked.append((-prevalence * (1.0 - mean_reward), tag))
    return [tag for _, tag in sorted(ranked)[:top_k]]


class LearningInterface:
    """Omega_t, configured by `config.interface`, checkpointable.

    Per training step: `renderer()` goes to `EnvPool.reset`; after the step's episodes were
    added to the failure profile, `update(episodes, profile)`; `log_record()` for the run log.
    """

    def __init__(self, config: Any) -> None:
        self.modes = {c: str(getattr(config, c)) for c in COMPONENTS}
        bad = {c: m for c, m in self.modes.items() if m not in MODES}
        if bad:
            raise ValueError(f"interface switches must be one of {MODES}; got {bad}")
        self.schema_types = bool(config.schema_types)
        self.plain = Renderer(prompt_style=str(config.prompt_style))  # ValueError if unknown
        self.decay = float(config.decay)
        self.on_count = float(config.on_count)
        self.off_count = float(config.off_count)
        if not (0.0 <= self.decay < 1.0 and 0.0 < self.off_count <= self.on_count):
            raise ValueError(
                "need 0 <= decay < 1 and 0 < off_count <= on_count; got "
                f"{self.decay}, {self.off_count}, {self.on_count}"
            )
        self.guideline_rule = dict(
            min_count=int(config.guideline_min_count),
            min_prevalence=float(config.guideline_min_prevalence),
            max_reward=float(config.guideline_max_reward),
            top_k=int(config.guideline_top_k),
            excluded_tags=EXCLUDED_TAGS,
        )
        self.state = InterfaceState()

    def renderer(self, evaluation: bool = False) -> Renderer:
        """Returns the interface to show now (in `config.interface.prompt_style`): the plain
        `Renderer` when `evaluation` is set."""
        if evaluation:
            return self.plain
        active = {c: tuple(units) for c, units in self.state.active.items()}
        return InterfaceRenderer(
            dict(self.modes), active, self.schema_types, prompt_style=self.plain.prompt_style
        )

    def update(self, episodes: Sequence[EpisodeResult], profile: FailureProfile) -> None:
        """Applies one closed-loop step (module docstring) from a training step's diagnoses.

        Args:
          episodes: the step's episode verdicts (turn causes, error kinds, tool attribution).
          profile: the failure profile C_t, already holding this step's episodes.
        """
        state = self.state
        previous = copy.deepcopy(state.active)
        for component, counts in step_evidence(episodes).items():
            if self.modes[component] == "adaptive":
                self._accumulate(component, counts)
        if self.modes["guidelines"] == "adaptive":
            state.active["guidelines"] = select_guidelines(
                profile.tags.summary(), **self.guideline_rule
            )
        state.step += 1
        if state.active != previous:
            state.version += 1

    def _accumulate(self, component: str, counts: Counter) -> None:
        """Decays and adds evidence, then switches units on and off with hysteresis."""
        evidence = self.state.evidence[component]
        active = set(self.state.active[component])
        for unit in evidence.keys() | counts.keys():
            evidence[unit] = self.decay * evidence.get(unit, 0.0) + counts[unit]
        self.state.active[component] = sorted(
            unit
            for unit, e in evidence.items()
            if e >= self.on_count or (unit in active and e >= self.off_count)
        )

    def log_record(self) -> dict[str, Any]:
        """Returns this step's JSON-able record: step, version, modes, active units, evidence."""
        return {"modes": dict(self.modes), **self.state.to_dict()}

    def metrics(self) -> dict[str, float]:
        """Returns scalars for the metric writer: version and active units per component."""
        metrics = {"interface/version": float(self.state.version)}
        for component, units in self.state.active.items():
            metrics[f"interface/{component}"] = float(len(units))
        return metrics

    def to_dict(self) -> dict[str, Any]:
        """Returns the learned state as plain JSON-able data (for checkpoints)."""
        return self.state.to_dict()

    @classmethod
    def from_dict(cls, config: Any, data: Mapping[str, Any]) -> LearningInterface:
        """Rebuilds an interface from `config` and the state written by `to_dict`."""
        interface = cls(config)
        interface.state = InterfaceState.from_dict(data)
        return interface

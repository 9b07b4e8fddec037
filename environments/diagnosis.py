"""Turn-level diagnosis: one failure tag per ground-truth user turn plus its fine causes.

Tags follow docs/method.md section 2 (first matching rule wins). Two project choices: a turn
gets `instance_mismatch` only when it fails the official check (so `pass` always means the
official checker accepts the turn), and `checker_error` is tested before the comparisons
that need the checker. Causes are observations about the turn, not alternatives to the tag.

`instance_mismatch` has two rules (INSTANCE_RULES): "instantiated", the SEAL release's (the
sets of instantiated tool classes differ, or the ground truth has none; BFCL's executor
instantiates every class of the task for any call list it runs, so once a model call ran the
sets are equal and the tag practically never fires), and "touched", this project's stricter
option (the classes the model's calls ran on differ from the ground truth's).
"""

from dataclasses import dataclass, field

TAGS = (
    "gt_error",
    "spurious_tool_call",
    "correct_abstention",
    "empty_turn_model_response",
    "instance_mismatch",
    "state_mismatch",
    "response_mismatch",
    "checker_error",
    "pass",
)
INSTANCE_RULES = ("instantiated", "touched")
CAUSES = ("invalid_tool_call", "argument_mismatch", "recovery_failure", "missing_tool_call")
GOOD_TAGS = frozenset({"pass", "correct_abstention"})
# Tags that blame the ground truth or the checker, not the policy: they get no utility of their
# own (rho stays 1), count in no prevalence, and never choose a guideline.
EXCLUDED_TAGS = ("gt_error", "checker_error")


@dataclass
class TurnRecord:
    """What happened in one user turn, for the model and for the ground truth.

    Attributes:
      truth_tools: names of the ground-truth calls of the turn.
      truth_classes: classes the ground-truth calls ran on.
      truth_instances: classes BFCL's executor instantiates for the ground truth (all of the
        task's, also for an empty call list).
      truth_error: a ground-truth call could not be parsed or raised.
      reached: the episode got to this turn.
      made_calls: the model made at least one decodable call.
      model_tools: names of the model's calls that ran.
      model_classes: classes the model's calls ran on.
      model_instances: classes BFCL's executor instantiates for the model's calls: all of the
        task's once a call of the turn went to the executor, else none.
      invalid_calls: unparseable blocks and calls to tools that do not exist.
      argument_errors: calls whose arguments broke the tool's schema.
      error_kinds: error kinds of every error observation in the turn, in order.
      state_ok: instances equal the ground truth's after the turn (None: not compared).
      results_ok: ground-truth results all found among the model's (None: not compared).
      checker_error: comparing raised.
    """

    truth_tools: list[str] = field(default_factory=list)
    truth_classes: set[str] = field(default_factory=set)
    truth_instances: set[str] = field(default_factory=set)
    truth_error: bool = False
    reached: bool = True
    made_calls: bool = False
    model_tools: set[str] = field(default_factory=set)
    model_classes: set[str] = field(default_factory=set)
    model_instances: set[str] = field(default_factory=set)
    invalid_calls: int = 0
    argument_errors: int = 0
    error_kinds: list[str] = field(default_factory=list)
    state_ok: bool | None = None
    results_ok: bool | None = None
    checker_error: bool = False

    @property
    def official_pass(self) -> bool:
        """The official checker's verdict for this turn (turns without ground truth pass)."""
        if not self.truth_tools:
            return True
        return self.made_calls and bool(self.state_ok) and bool(self.results_ok)


def turn_tag(record: TurnRecord, instance_rule: str = "instantiated") -> str:
    """Returns the turn's tag from TAGS (first matching rule); `instance_rule` (INSTANCE_RULES)
    decides `instance_mismatch`."""
    if record.truth_error:
        return "gt_error"
    if not record.truth_tools:
        return "spurious_tool_call" if record.made_calls else "correct_abstention"
    if not record.made_calls:
        return "empty_turn_model_response"
    if record.checker_error:
        return "checker_error"
    if record.official_pass:
        return "pass"
    if instances_differ(record, instance_rule):
        return "instance_mismatch"
    return "state_mismatch" if not record.state_ok else "response_mismatch"


def instances_differ(record: TurnRecord, rule: str) -> bool:
    """Whether the turn's tool classes differ from the ground truth's under `rule`."""
    if rule == "touched":
        return record.model_classes != record.truth_classes
    if rule == "instantiated":
        return not record.truth_instances or record.model_instances != record.truth_instances
    raise ValueError(f"instance rule must be one of {INSTANCE_RULES}, got {rule!r}")


def turn_causes(record: TurnRecord, tag: str) -> set[str]:
    """Returns the fine causes (subset of CAUSES) observed in the turn.

    invalid_tool_call: an unparseable block or a call to a tool that does not exist.
    argument_mismatch: a call whose arguments broke the schema.
    recovery_failure: the turn got an error back and still failed.
    missing_tool_call: the turn failed without calling every tool its ground truth calls.
    """
    causes = set()
    if record.invalid_calls:
        causes.add("invalid_tool_call")
    if record.argument_errors:
        causes.add("argument_mismatch")
    failed = tag not in GOOD_TAGS
    if failed and record.error_kinds:
        causes.add("recovery_failure")
    if failed and record.truth_tools and not set(record.truth_tools) <= record.model_tools:
        causes.add("missing_tool_call")
    return causes

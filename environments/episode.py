"""The multi-turn episode: show a task, execute the agent's calls, verify and diagnose each turn.

Three execution modes (MODES):

* `official` mirrors BFCL's pipeline: every public method of the task's classes can be called
  (listed or not, arguments unchecked), `<tool_call>` blocks BFCL cannot decode are dropped
  silently, and a reply without a decodable call ends the user turn.
* `release` mirrors the SEAL release's BFCL environment (training and validation alike): its
  strict parser (`toolcall.parse_release_reply`), and calls only to tools currently shown;
  a reply with an unusable block or an unshown tool runs none of its calls, gets one
  `[ERROR] Invalid tool call format: ...` user message back and does not end the turn, and
  counts as no call (a turn of only such replies is a turn without a call). Arguments run
  unchecked, as in BFCL.
* `training` (this project's option) refuses tools not currently shown and calls whose
  arguments break the schema (each refused call gets a typed error, the others run), and
  answers unparseable blocks with an error; such a reply does not end the turn.

Evaluation protocols (PROTOCOLS) are the modes an evaluation may use: `release` (the paper's
numbers) and `official` (BFCL's runner). In every mode the verdict uses the official checks on
what actually ran, so official mode agrees with the `bfcl_eval` checker. Diagnosis replays
every turn (no early stop).
"""

from dataclasses import dataclass, field
from typing import Any

from environments.diagnosis import INSTANCE_RULES, TurnRecord, turn_causes, turn_tag
from environments.executor import CallOutcome, Toolbox, check_arguments, make_instances
from environments.rendering import Message, Renderer
from environments.task import ToolTask
from environments.toolcall import (
    ToolCall,
    parameter_schemas,
    parse_python_call,
    parse_release_reply,
    parse_reply,
)
from environments.verification import missing_results, state_differences

MODES = ("official", "release", "training")
PROTOCOLS = ("release", "official")  # the modes an evaluation may use
_FAILED_RUN = frozenset({"unknown_tool", "tool_error", "timeout"})


@dataclass(frozen=True)
class EpisodeConfig:
    """Episode settings.

    Attributes:
      mode: one of MODES (module docstring).
      max_model_calls: assistant messages allowed per episode; reaching it with turns left
        (or with calls still pending) ends the episode ("step_limit"; whether that fails it:
        EpisodeResult.success).
      call_time_limit_s: wall-clock limit of one tool call.
      max_call_chars: longest JSON payload accepted for one call.
      instance_rule: how `instance_mismatch` is decided (environments.diagnosis.INSTANCE_RULES).
    """

    mode: str = "official"
    max_model_calls: int = 20
    call_time_limit_s: float = 5.0
    max_call_chars: int = 100_000
    instance_rule: str = "instantiated"

    @classmethod
    def from_config(cls, env_config: Any, mode: str) -> "EpisodeConfig":
        """The episode settings of `config.env` in `mode`."""
        return cls(
            mode=mode,
            max_model_calls=env_config.max_model_calls,
            call_time_limit_s=env_config.call_time_limit_s,
            instance_rule=env_config.instance_mismatch,
        )


@dataclass
class EpisodeResult:
    """The verdict on one episode.

    Attributes:
      success: every turn passes the official checks and the episode was not cut short (in
        release mode: cut short before its last turn; the release judges the turns it has).
      turn_tags: one tag per ground-truth user turn (environments.diagnosis.TAGS).
      turn_causes: per turn, the set of fine causes (environments.diagnosis.CAUSES).
      turn_error_kinds: per turn, the error kinds of its error observations.
      turn_argument_tools: per turn, the tool of every model call whose arguments broke its
        schema (refused in training mode, run in official mode), in order.
      turn_missing_tools: per turn with the `missing_tool_call` cause, the ground-truth tools
        the model never ran in it (sorted); [] for other turns.
      failure_reason: why the episode ended early ("step_limit", "incomplete", a worker
        failure), else None.
      transcript: every message of the episode, system prompt first.
      observations: per turn, the messages the environment produced in it.
    """

    task_id: str
    category: str
    success: bool
    turn_tags: list[str]
    turn_causes: list[set[str]]
    turn_error_kinds: list[list[str]]
    failure_reason: str | None = None
    model_calls: int = 0
    transcript: list[Message] = field(default_factory=list)
    observations: list[list[Message]] = field(default_factory=list)
    turn_argument_tools: list[list[str]] = field(default_factory=list)
    turn_missing_tools: list[list[str]] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """Binary reward: 1.0 on success."""
        return float(self.success)

    @property
    def strict_success(self) -> bool:
        """`success` that also passes BFCL's irrelevance check (see `strict_success`)."""
        return strict_success(self.success, self.turn_tags)


def strict_success(success: bool, turn_tags: list[str]) -> bool:
    """`success` that also passes BFCL's `multi_turn_irrelevance_checker`: no call on a turn
    whose ground truth makes none. bfcl_eval ships that check but its runner does not apply it,
    so official success accepts a held-back function called before its reveal."""
    return bool(success) and "spurious_tool_call" not in turn_tags


class Episode:
    """One agent episode on one task: `reset`, then `step` until done, then `result`.

    Holds fresh instances for the agent and, separately, for the ground truth; both advance
    turn by turn, and each finished turn is verified and diagnosed at once.
    """

    def __init__(
        self, task: ToolTask, config: EpisodeConfig | None = None, renderer: Renderer | None = None
    ) -> None:
        self.task = task
        self.config = config or EpisodeConfig()
        if self.config.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.config.mode!r}")
        if self.config.instance_rule not in INSTANCE_RULES:
            raise ValueError(
                f"instance_rule must be one of {INSTANCE_RULES}, got {self.config.instance_rule!r}"
            )
        self.renderer = renderer or Renderer()
        self.model = Toolbox(make_instances(task.classes, task.initial_config, task.long_context))
        self.truth = Toolbox(make_instances(task.classes, task.initial_config, task.long_context))
        all_docs = task.docs + [d for docs in task.revealed_docs.values() for d in docs]
        self.docs = {doc["name"]: doc for doc in all_docs}
        self.shown = {doc["name"] for doc in task.docs}
        self.turn = 0
        self.model_calls = 0
        self.done = False
        self.failure_reason: str | None = None
        self.model_results: list[str] = []  # every recorded result, all turns (official rule)
        self.records: list[TurnRecord] = []
        self.current = TurnRecord()
        self.transcript: list[Message] = []
        self.observations: list[list[Message]] = []
        self.argument_tools: dict[int, list[str]] = {}  # turn -> tools called with bad arguments

    def reset(self) -> list[Message]:
        """Returns the opening messages: the system prompt and the first user turn."""
        if self.transcript:
            raise RuntimeError("reset() called twice; create a new Episode per rollout")
        system = self.renderer.system(self.task.docs, self.task.system_preamble)
        self.transcript.append(system)
        return [system] + self._open_turn()

    def step(self, assistant_text: str) -> tuple[list[Message], bool]:
        """Feeds one assistant message; returns (observation messages, done).

        The observation is the tool messages when the reply made calls, else the next user
        turn ([] when the conversation is over).
        """
        observation = self.act(assistant_text)
        budget_left = self.model_calls < self.config.max_model_calls
        if observation and budget_left:
            return observation, False
        if observation:  # Calls still pending when the budget ran out.
            self.failure_reason = "step_limit"
        observation = self.finish_turn()
        if not self.done and not budget_left:
            self.failure_reason = "step_limit"
            self.done = True
        return observation, self.done

    def act(self, assistant_text: str) -> list[Message]:
        """Runs the calls of one assistant message in the current turn; returns tool messages."""
        self._check_running()
        self.model_calls += 1
        self.transcript.append({"role": "assistant", "content": assistant_text})
        if self.config.mode == "release":
            calls, messages = self._release_calls(assistant_text)
        else:
            reply = parse_reply(
                assistant_text,
                self.config.max_call_chars,
                self.renderer.tool_format,
                self._shown_schemas(),
            )
            self.current.invalid_calls += len(reply.invalid)
            training = self.config.mode == "training"
            calls = reply.calls if training else reply.official_calls
            messages = [self.renderer.unparseable(reason) for reason in reply.invalid if training]
        self.current.made_calls |= bool(calls)
        shown = [name for name in self.docs if name in self.shown]
        for call in calls:
            messages.append(self.renderer.tool_message(self._run_model_call(call), shown))
        for message in messages:
            if "error_kind" in message:
                self.current.error_kinds.append(message["error_kind"])
        self._record(messages)
        return messages

    def finish_turn(self) -> list[Message]:
        """Closes the current turn (verify, diagnose) and returns the next turn's opening."""
        self._check_running()
        self._verify_turn(self.current)
        self.records.append(self.current)
        self.current = TurnRecord()
        self.turn += 1
        if self.turn == len(self.task.turns):
            self.done = True
            return []
        return self._open_turn()

    def result(self) -> EpisodeResult:
        """Ends the episode and returns its verdict.

        A turn in progress is verified as it stands; turns never reached count as turns
        without a model call, and the episode as "incomplete".
        """
        if not self.done:
            self._verify_turn(self.current)
            self.records.append(self.current)
            self.failure_reason = self.failure_reason or "incomplete"
            self.done = True
        records = self.records + [
            self._unreached(i) for i in range(len(self.records), len(self.task.turns))
        ]
        tags = [turn_tag(record, self.config.instance_rule) for record in records]
        causes = [turn_causes(r, tag) for r, tag in zip(records, tags)]
        reason = self.failure_reason
        return EpisodeResult(
            task_id=self.task.task_id,
            category=self.task.category,
            success=not self._cut_short() and all(r.official_pass for r in records),
            turn_tags=tags,
            turn_causes=causes,
            turn_error_kinds=[list(r.error_kinds) for r in records],
            failure_reason=reason,
            model_calls=self.model_calls,
            transcript=self.transcript,
            observations=self.observations,
            turn_argument_tools=[self.argument_tools.get(t, []) for t in range(len(records))],
            turn_missing_tools=[
                sorted(set(r.truth_tools) - r.model_tools) if "missing_tool_call" in c else []
                for r, c in zip(records, causes)
            ],
        )

    def _cut_short(self) -> bool:
        """Whether an early end fails the episode. The release scores the turns it reached with
        BFCL's checker, which fails only a conversation with fewer turns than the task."""
        if self.config.mode == "release":
            return len(self.records) < len(self.task.turns)
        return self.failure_reason is not None

    def _check_running(self) -> None:
        """Raises when the episode is over: a caller bug that must not pass silently."""
        if self.done:
            raise RuntimeError(f"episode {self.task.task_id} is done; create a new Episode")

    def _open_turn(self) -> list[Message]:
        """Returns the messages opening the current turn, revealing held-back tools first."""
        messages = []
        revealed = self.task.revealed_docs.get(self.turn)
        if revealed:
            self.shown |= {doc["name"] for doc in revealed}
            messages.append(self.renderer.reveal(revealed))
        messages += self.renderer.user_turn(self.task.turns[self.turn])
        self._record(messages)
        return messages

    def _record(self, messages: list[Message]) -> None:
        """Appends environment messages to the transcript and to the current turn's log."""
        self.transcript.extend(messages)
        while len(self.observations) <= self.turn:
            self.observations.append([])
        self.observations[self.turn].extend(messages)

    def _release_calls(self, text: str) -> tuple[list[ToolCall], list[Message]]:
        """The release's checks of one reply: (calls to run, error messages). A parse error or
        a call to a tool not shown rejects the whole reply: nothing runs."""
        calls, errors = parse_release_reply(text, self.renderer.tool_format, self._shown_schemas())
        kind = "unparseable"
        if not errors:  # the first call to a tool not shown (or without a name) rejects all
            kind = "unknown_tool"
            unshown = next((call.name for call in calls if call.name not in self.shown), None)
            if unshown == "":
                errors = ["Missing function name in tool call."]
            elif unshown is not None:
                errors = [f"Tool '{unshown}' is not available in the current tool list."]
        if not errors:
            return calls, []
        self.current.invalid_calls += len(errors)
        return [], [self.renderer.rejected("; ".join(errors), kind)]

    def _shown_schemas(self) -> dict[str, dict]:
        """The parameter schema of each tool currently shown, by name: how the parser reads the
        argument values of `qwen_xml` calls (toolcall.parse_reply)."""
        return parameter_schemas(self.docs[name] for name in self.shown)

    def _run_model_call(self, call: ToolCall) -> CallOutcome:
        """Checks and (unless refused in training mode) executes one model call."""
        doc = self.docs.get(call.name)
        problem = check_arguments(call, doc) if doc else None
        self.current.argument_errors += problem is not None
        if problem:
            self.argument_tools.setdefault(self.turn, []).append(call.name)
        if self.config.mode == "training":
            if call.name not in self.shown:
                self.current.invalid_calls += 1
                return CallOutcome(None, "unknown_tool", {"tool": call.name})
            if problem:
                return CallOutcome(None, problem[0], problem[1])
        outcome = self.model.execute(call, self.config.call_time_limit_s)
        self.current.model_instances = set(self.task.classes)  # as BFCL's executor, any call
        self.current.invalid_calls += outcome.error_kind == "unknown_tool"
        if outcome.result is not None:
            self.model_results.append(outcome.result)
        if outcome.class_name is not None:
            self.current.model_tools.add(call.name)
            self.current.model_classes.add(outcome.class_name)
        return outcome

    def _run_truth(self, record: TurnRecord) -> list[str]:
        """Executes the turn's ground truth on its own instances; returns its results."""
        results = []
        record.truth_instances = set(self.task.classes)
        for source in self.task.ground_truth[self.turn]:
            try:
                call = parse_python_call(source)
            except ValueError:
                record.truth_error = True
                continue
            outcome = self.truth.execute(call, self.config.call_time_limit_s)
            record.truth_tools.append(call.name)
            record.truth_error |= outcome.error_kind in _FAILED_RUN
            if outcome.class_name:
                record.truth_classes.add(outcome.class_name)
            if outcome.result is not None:
                results.append(outcome.result)
        return results

    def _verify_turn(self, record: TurnRecord) -> None:
        """Runs the ground truth and the official state and result checks for the turn."""
        truth_results = self._run_truth(record)
        if not record.truth_tools or not record.made_calls:
            return
        try:
            record.state_ok = not state_differences(self.model.instances, self.truth.instances)
            record.results_ok = not missing_results(truth_results, self.model_results)
        except Exception:  # The checker itself failed: tag it rather than crash the episode.
            record.checker_error = True

    def _unreached(self, turn: int) -> TurnRecord:
        """A turn the episode never got to: the ground truth's calls, none of the model's."""
        record = TurnRecord(reached=False, truth_instances=set(self.task.classes))
        for source in self.task.ground_truth[turn]:
            try:
                record.truth_tools.append(parse_python_call(source).name)
            except ValueError:
                record.truth_error = True
        return record

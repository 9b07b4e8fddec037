"""One constructed trajectory per diagnosis tag and per fine cause, on a tiny tool suite."""

import pytest

from environments.bfcl import score_task
from environments.diagnosis import CAUSES, TAGS
from environments.task import ToolTask
from environments.toolcall import ToolCall, render_tool_call


class Counter:
    def __init__(self):
        self.count = 0

    def increment(self, by: int):
        self.count += by
        return {"count": self.count}

    def explode(self):
        raise RuntimeError("boom")


class Notes:
    def __init__(self):
        self.notes = []

    def add_note(self, text: str):
        self.notes.append(text)
        return "added"

    def count_notes(self):
        return {"notes": len(self.notes)}


class Unequal:
    def __ne__(self, other):
        raise TypeError("cannot compare")


class Fragile:
    def __init__(self):
        self.value = Unequal()

    def poke(self):
        return "poked"


def doc(name, **properties):
    props = {key: {"type": kind} for key, kind in properties.items()}
    return {
        "name": name,
        "description": name,
        "parameters": {"type": "dict", "properties": props, "required": list(props)},
    }


DOCS = [
    doc("increment", by="integer"),
    doc("explode"),
    doc("add_note", text="string"),
    doc("count_notes"),
]
TASK = ToolTask(
    task_id="toy_0",
    category="toy",
    turns=[
        [{"role": "user", "content": "Add 2."}],
        [{"role": "user", "content": "Fly me to Mars."}],
        [{"role": "user", "content": "Note 'hi' and count notes."}],
    ],
    docs=DOCS,
    ground_truth=[["increment(by=2)"], [], ["add_note(text='hi')", "count_notes()"]],
    classes={"Counter": Counter, "Notes": Notes},
    initial_config={},
)
DONE = "Done."


def call(name, **arguments):
    return render_tool_call(ToolCall(name, arguments))


ORACLE = [
    [call("increment", by=2), DONE],
    [DONE],
    [call("add_note", text="hi") + "\n" + call("count_notes"), DONE],
]


def run(turns, task=TASK, mode="official"):
    return score_task(task, turns, mode)


def replay(turns, mode="official", instance_rule="instantiated", task=TASK):
    """score_task with an instance rule: the given replies, turn by turn."""
    return score_task(task, turns, mode, instance_rule)


def with_turn(index, messages):
    turns = [list(m) for m in ORACLE]
    turns[index] = messages
    return turns


def test_oracle_passes_every_turn():
    result = run(ORACLE)
    assert result.success
    assert result.turn_tags == ["pass", "correct_abstention", "pass"]
    assert result.turn_causes == [set(), set(), set()]


@pytest.mark.parametrize(
    ("turn", "messages", "tag"),
    [
        (1, [call("increment", by=0), DONE], "spurious_tool_call"),
        (0, [DONE], "empty_turn_model_response"),
        (0, ["<tool_call>\nnot json\n</tool_call>", DONE], "empty_turn_model_response"),
        (0, [call("increment", by=3), DONE], "state_mismatch"),
        (2, [call("add_note", text="hi"), DONE], "response_mismatch"),
    ],
)
def test_each_tag(turn, messages, tag):
    result = run(with_turn(turn, messages))
    assert result.turn_tags[turn] == tag


def test_instance_rules():
    """The release's rule compares the classes BFCL's executor instantiates: every class of the
    task once a call of the turn ran, for the model as for the ground truth. Calling the wrong
    class therefore leaves the sets equal ({Counter, Notes} both) and the turn is judged on its
    state; the stricter "touched" rule compares {Counter} with {Notes}."""
    wrong_class = with_turn(2, [call("increment", by=0), DONE])
    assert replay(wrong_class).turn_tags[2] == "state_mismatch"
    assert replay(wrong_class, instance_rule="touched").turn_tags[2] == "instance_mismatch"
    # Nothing ran (training mode refuses the call's bad argument): the model's set is empty.
    refused = with_turn(0, [call("increment", by="two"), DONE])
    assert replay(refused, mode="training").turn_tags[0] == "instance_mismatch"
    with pytest.raises(ValueError, match="instance_rule"):
        replay(ORACLE, instance_rule="classes")


def test_gt_error_tag():
    task = ToolTask(
        **{
            **TASK.__dict__,
            "ground_truth": [["explode()"], [], ["add_note(text='hi')", "count_notes()"]],
        }
    )
    result = run(with_turn(0, [call("explode"), DONE]), task)
    assert result.turn_tags[0] == "gt_error"
    unparsable = ToolTask(**{**TASK.__dict__, "ground_truth": [["increment(by=x)"], [], []]})
    assert run([[DONE], [DONE], [DONE]], unparsable).turn_tags[0] == "gt_error"


def test_checker_error_tag():
    task = ToolTask(
        "toy_1",
        "toy",
        [[{"role": "user", "content": "Poke."}]],
        [doc("poke")],
        [["poke()"]],
        {"Fragile": Fragile},
        {},
    )
    result = run([[call("poke"), DONE]], task)
    assert result.turn_tags == ["checker_error"] and not result.success


def test_unreached_turns():
    result = run(ORACLE[:1])
    assert result.turn_tags == ["pass", "correct_abstention", "empty_turn_model_response"]
    assert result.failure_reason == "incomplete" and not result.success


def test_tags_continue_after_a_failed_turn():
    result = run(with_turn(0, [call("increment", by=3), DONE]))
    # Counter state stays off, so the later turn fails too, but it is still diagnosed.
    assert result.turn_tags == ["state_mismatch", "correct_abstention", "state_mismatch"]


@pytest.mark.parametrize(
    ("messages", "cause"),
    [
        (
            ["<tool_call>\n{broken\n</tool_call>", call("increment", by=2), DONE],
            "invalid_tool_call",
        ),
        ([call("decrement", by=2), call("increment", by=2), DONE], "invalid_tool_call"),
        ([call("increment", by="2"), DONE], "argument_mismatch"),
        ([call("increment", by=2, extra=1), DONE], "argument_mismatch"),
        ([call("explode"), DONE], "recovery_failure"),
        ([DONE], "missing_tool_call"),
    ],
)
def test_each_cause(messages, cause):
    result = run(with_turn(0, messages))
    assert cause in result.turn_causes[0]


def test_recovered_errors_and_passing_turns_carry_no_failure_causes():
    result = run(with_turn(0, [call("explode"), call("increment", by=2), DONE]))
    assert result.turn_tags[0] == "pass"
    assert result.turn_causes[0] == set()
    assert result.turn_error_kinds[0] == ["tool_error"]


def test_missing_tool_call_on_partial_turn():
    result = run(with_turn(2, [call("add_note", text="hi"), DONE]))
    assert result.turn_causes[2] == {"missing_tool_call"}


def test_tag_and_cause_vocabularies():
    assert len(TAGS) == 9 and len(CAUSES) == 4

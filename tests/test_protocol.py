"""The SEAL release's protocol (docs/protocol.md), each against an independent reference.

* Prompt: the system prompt against BFCL's own QwenFCHandler formatting (bfcl-eval's source),
  reveals and schema cues against the release's documented strings.
* Episodes in release mode: hand-derived cases of its strict parser and tool check, and verdicts
  against BFCL's checker run on the calls the release accepts.
* The instance rule, the evaluation protocols, and the paper preset's config.
"""

import ast
import copy
import functools
import json
import random
import subprocess
import sys
import types
from pathlib import Path

import bfcl_eval
import pytest
from bfcl_eval.constants.default_prompts import (
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
)
from bfcl_eval.constants.eval_config import PROMPT_PATH
from bfcl_eval.utils import load_file, populate_test_cases_with_predefined_functions

from configs import base, qwen, tiny
from environments.bfcl import all_task_ids, evaluate, load_task, score, score_task, split_ids
from environments.episode import PROTOCOLS, Episode, EpisodeConfig
from environments.interface import InterfaceRenderer, LearningInterface
from environments.policies import oracle_turns
from environments.pool import EnvPool, PoolConfig
from environments.rendering import Renderer
from environments.sources import get_source
from environments.task import ToolTask
from seal_jax import config as config_lib
from seal_jax import evaluation
from tests.test_bfcl_agreement import (
    ACCEPTING_KINDS,
    REJECTING_KINDS,
    _perturb,
    official_verdict,
)
from tests.test_diagnosis import DOCS, DONE, ORACLE, TASK, Counter, call, with_turn

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
GOLDEN_IDS = [f"multi_turn_{c}_{i}" for c in CATEGORIES for i in (0, 137)]
# The release's instruction line (its observation_lite default), typed from its config defaults.
RELEASE_INSTRUCTION = (
    "Observation note: parameters marked [required] must be provided exactly when calling a "
    "tool; do not invent tools outside the current schema."
)
RELEASE = Renderer(prompt_style="release")


# ---- references from bfcl-eval -----------------------------------------------------------------


@functools.cache
def bfcl_format_prompt():
    """BFCL's QwenFCHandler._format_prompt, compiled from bfcl-eval's own source: importing
    the handler module needs packages we do not install (tree_sitter)."""
    path = Path(bfcl_eval.__file__).parent / "model_handler" / "local_inference" / "qwen_fc.py"
    tree = ast.parse(path.read_text())
    handler = next(n for n in tree.body if getattr(n, "name", "") == "QwenFCHandler")
    function = next(n for n in handler.body if getattr(n, "name", "") == "_format_prompt")
    function.decorator_list = []
    namespace = {"json": json}
    exec(compile(ast.Module([function], []), str(path), "exec"), namespace)  # library code
    return namespace["_format_prompt"]


def bfcl_system_prompt(functions: list[dict]) -> str:
    """The system text BFCL's Qwen handler renders for these function docs."""
    text = bfcl_format_prompt()(None, [{"role": "user", "content": "?"}], functions)
    head, tail = "<|im_start|>system\n", "<|im_end|>\n<|im_start|>user\n?<|im_end|>\n"
    assert text.startswith(head) and tail in text
    return text[len(head) : text.index(tail)]


@functools.cache
def bfcl_entries(category: str) -> dict:
    """BFCL's entries with their function docs populated by bfcl-eval, and answers, by id."""
    name = f"BFCL_v4_multi_turn_{category}.json"
    entries = populate_test_cases_with_predefined_functions(load_file(PROMPT_PATH / name))
    answers = {a["id"]: a for a in load_file(PROMPT_PATH / "possible_answer" / name)}
    return {e["id"]: (e, answers[e["id"]]) for e in entries}


def bfcl_entry(task_id: str) -> tuple[dict, dict]:
    category = task_id.rsplit("_", 1)[0].removeprefix("multi_turn_")
    entry, answer = bfcl_entries(category)[task_id]
    return copy.deepcopy(entry), answer


@functools.cache
def needs_hidden_tools() -> frozenset[str]:
    """Tasks whose ground truth calls a function before BFCL reveals it: the release's check of
    shown tools makes them unsolvable (found from bfcl-eval's data alone)."""
    found = set()
    for category in CATEGORIES:
        for task_id, (entry, answer) in bfcl_entries(category).items():
            shown = {f["name"] for f in entry["function"]}
            for turn, calls in enumerate(answer["ground_truth"]):
                shown |= {f["name"] for f in entry.get("missed_function", {}).get(str(turn), [])}
                if any(source.split("(")[0] not in shown for source in calls):
                    found.add(task_id)
    return frozenset(found)


def release_reveal(functions: list[dict]) -> str:
    """The release's hand-over text: BFCL's prompt template with the docs as one JSON list."""
    return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
        functions=json.dumps(functions, ensure_ascii=False)
    )


# ---- item 6: the prompt ------------------------------------------------------------------------


@pytest.mark.parametrize("task_id", GOLDEN_IDS)
def test_release_system_prompt_is_bfcls_qwen_handlers(task_id):
    entry, _ = bfcl_entry(task_id)
    expected = bfcl_system_prompt(entry["function"])
    assert RELEASE.system(load_task(task_id).docs)["content"] == expected
    assert '"response": {' in expected and '"type": "dict"' in expected  # the docs as they are


def _reveals(multiple: bool) -> list[tuple[str, str]]:
    return [
        (task_id, turn)
        for task_id, (entry, _) in bfcl_entries("miss_func").items()
        for turn, functions in entry["missed_function"].items()
        if (len(functions) > 1) == multiple
    ]


def _assert_reveal(task_id: str, turn: str) -> None:
    entry, _ = bfcl_entry(task_id)
    docs = load_task(task_id).revealed_docs[int(turn)]
    assert RELEASE.reveal(docs)["content"] == release_reveal(entry["missed_function"][turn])


@pytest.mark.parametrize(("task_id", "turn"), _reveals(multiple=False)[::10])
def test_release_reveal_is_the_releases(task_id, turn):
    _assert_reveal(task_id, turn)


def test_release_reveal_order_of_several_functions():
    for task_id, turn in _reveals(multiple=True):
        _assert_reveal(task_id, turn)


def _release_cued(functions: list[dict]) -> list[dict]:
    """The release's required cue by hand: " [required]" after each required parameter's
    description (multi-turn docs have no enums, asserted)."""
    functions = copy.deepcopy(functions)
    for function in functions:
        parameters = function["parameters"]
        for name, spec in parameters.get("properties", {}).items():
            assert "enum" not in spec and "[required]" not in spec["description"]
            if name in parameters.get("required", []):
                spec["description"] += " [required]"
    return functions


def released_renderer(prompt_style: str = "release") -> InterfaceRenderer:
    interface = base.base_config().interface  # the "released" preset: static schema cues
    interface.prompt_style = prompt_style
    return LearningInterface(interface).renderer()


@pytest.mark.parametrize("task_id", GOLDEN_IDS[::3])
def test_release_schema_cues_are_the_releases(task_id):
    entry, _ = bfcl_entry(task_id)
    expected = bfcl_system_prompt(_release_cued(entry["function"])) + "\n\n" + RELEASE_INSTRUCTION
    assert released_renderer().system(load_task(task_id).docs)["content"] == expected


def test_release_cue_wording():
    renderer = released_renderer()
    cd = next(d for d in load_task("multi_turn_base_0").docs if d["name"] == "cd")
    folder = renderer.tools([cd])[0]["parameters"]["properties"]["folder"]["description"]
    # BFCL's description ends with a space; the release appends " [required]" to it.
    assert folder == (
        "The folder of the directory to change to. You can only change one folder level at a "
        "time.  [required]"
    )
    doc = {
        "name": "set_unit",
        "description": "Sets the unit.",
        "parameters": {
            "type": "dict",
            "properties": {
                "unit": {"type": "string", "description": "Unit.", "enum": ["si", "us"]},
                "scale": {"type": "float", "description": "Scale [required] here."},
                "mode": {"type": "string", "enum": [1, 2]},
            },
            "required": ["unit", "scale"],
        },
    }
    typed = InterfaceRenderer(
        renderer.modes, renderer.active, schema_types=True, prompt_style="release"
    )
    properties = typed.tools([doc])[0]["parameters"]["properties"]
    assert (
        properties["unit"]["description"]
        == "Unit. [required] [type: string] Allowed values: si, us"
    )
    assert properties["scale"]["description"] == "Scale [required] here. [type: float]"
    assert properties["mode"]["description"] == "[type: string] Allowed values: 1, 2"


def test_release_cues_only_the_opening_tool_list():
    task = load_task("multi_turn_miss_func_0")
    docs = task.revealed_docs[3]
    assert released_renderer().reveal(docs) == RELEASE.reveal(docs)
    assert released_renderer("chat_template").reveal(docs) != Renderer().reveal(docs)


def test_evaluation_renders_the_plain_prompt_in_the_configured_style():
    interface = base.base_config().interface
    interface.prompt_style = "release"
    assert LearningInterface(interface).renderer(evaluation=True) == RELEASE
    with pytest.raises(ValueError, match="prompt_style"):
        Renderer(prompt_style="bfcl")


# ---- items 5 and 7: release-mode episodes --------------------------------------------------------


def first_step(text: str, mode: str = "release", task: ToolTask = TASK):
    """(observation, done, episode) after one reply on the toy task's first turn."""
    episode = Episode(task, EpisodeConfig(mode=mode))
    episode.reset()
    observation, done = episode.step(text)
    return observation, done, episode


def rejected(reason: str, kind: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": f"[ERROR] Invalid tool call format: {reason}",
            "error_kind": kind,
        }
    ]


BROKEN = '<tool_call>\n{"name": "increment", "arguments": {"by": 2}\n</tool_call>'
NOT_AN_OBJECT = "<tool_call>\nnot json\n</tool_call>"


def _json_error(text: str) -> str:
    try:
        json.loads(text)
    except ValueError as error:
        return str(error)
    raise AssertionError("valid JSON")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            call("increment", by=2) + "\n" + BROKEN,
            "Invalid tool call JSON: "
            + _json_error('{"name": "increment", "arguments": {"by": 2}'),
        ),
        (
            NOT_AN_OBJECT,
            "Found tool_call tag text, but no valid <tool_call>{...}</tool_call> block.",
        ),
        (
            '<tool_call>\n{"name": "increment"}\n</tool_call>',
            "Tool call JSON must contain both 'name' and 'arguments'.",
        ),
        (
            '<tool_call>\n{"name": "increment", "arguments": "by two"}\n</tool_call>',
            "Tool 'increment' has non-JSON string arguments.",
        ),
        (
            '<tool_call>\n{"name": "increment", "arguments": [2]}\n</tool_call>',
            "Tool 'increment' arguments must be a JSON object.",
        ),
        (call("increment", by=2) + call("", by=2), "Missing function name in tool call."),
    ],
)
def test_release_rejects_the_whole_reply(text, reason):
    kind = "unknown_tool" if reason.startswith("Missing") else "unparseable"
    observation, done, episode = first_step(text)
    assert observation == rejected(reason, kind) and not done  # the turn goes on
    assert episode.model.instances["Counter"].count == 0  # nothing ran
    episode.step(DONE)
    result = episode.result()
    assert result.turn_tags[0] == "empty_turn_model_response"
    assert "invalid_tool_call" in result.turn_causes[0]


@pytest.mark.parametrize(
    ("text", "release_count", "official_count"),
    [
        # No newlines around the object: the release's pattern allows it, BFCL's does not.
        ('<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call>', 2, 0),
        # A block without an object beside a usable one: both ignore it.
        (call("increment", by=2) + "\n" + NOT_AN_OBJECT, 2, 2),
        # Arguments given as a JSON string: both decode them.
        ('<tool_call>\n{"name": "increment", "arguments": "{\\"by\\": 2}"}\n</tool_call>', 2, 2),
    ],
)
def test_release_and_bfcl_parsers(text, release_count, official_count):
    for mode, count in (("release", release_count), ("official", official_count)):
        assert first_step(text, mode)[2].model.instances["Counter"].count == count


HIDDEN = ToolTask(**{**TASK.__dict__, "docs": DOCS[:3]})  # count_notes is never shown


def test_release_runs_no_call_of_a_reply_naming_a_tool_not_shown():
    reply = call("add_note", text="hi") + "\n" + call("count_notes")
    episode = Episode(HIDDEN, EpisodeConfig(mode="release"))
    episode.reset()
    episode.step(call("increment", by=2))
    episode.step(DONE)
    episode.step(DONE)  # turn 1
    observation, done = episode.step(reply)
    reason = "Tool 'count_notes' is not available in the current tool list."
    assert observation == rejected(reason, "unknown_tool") and not done
    assert episode.model.instances["Notes"].notes == []
    official = Episode(HIDDEN, EpisodeConfig(mode="official"))
    official.reset()
    official.act(reply)
    assert official.model.instances["Notes"].notes == ["hi"]  # BFCL runs any method


def test_a_turn_of_rejected_calls_is_a_turn_without_a_call():
    """Turn 1 needs no call; a call to a tool not shown is stripped by the release (so the turn
    is a correct abstention) and run by BFCL (a spurious call)."""
    turns = with_turn(1, [call("count_notes"), DONE])
    assert score_task(HIDDEN, turns, "release").turn_tags[1] == "correct_abstention"
    assert score_task(HIDDEN, turns, "official").turn_tags[1] == "spurious_tool_call"


def test_release_runs_calls_that_break_the_schema():
    """The release passes arguments to BFCL's executor unchecked: the tool's own error comes
    back (Counter adds a string to an int); training mode refuses the call instead."""
    observation, _, episode = first_step(call("increment", by="2"))
    with pytest.raises(TypeError) as error:
        Counter().increment("2")  # the tool's own failure
    expected = f"Error during execution: {error.value}"
    assert observation == [{"role": "tool", "content": expected, "error_kind": "tool_error"}]
    assert "argument_mismatch" in episode.result().turn_causes[0]
    training, _, _ = first_step(call("increment", by="2"), mode="training")
    assert training[0]["error_kind"] == "wrong_type"


@pytest.mark.parametrize(("budget", "release", "official"), [(4, True, False), (2, False, False)])
def test_release_judges_the_turns_it_reached(budget, release, official):
    """Four replies reach the last turn and leave its calls pending: the release scores the
    turns it has with BFCL's checker (a pass), the project's official mode fails a cut episode.
    Two replies never reach the last turn: BFCL's checker fails fewer turns than the task has."""
    replies = [m for turn in ORACLE for m in turn]
    for mode, success in (("release", release), ("official", official)):
        episode = Episode(TASK, EpisodeConfig(mode=mode, max_model_calls=budget))
        episode.reset()
        for text in replies:
            if episode.step(text)[1]:
                break
        assert episode.result().success == success


# Each injected reply repeats a call of its turn, then breaks the release's rules: running it
# would change the verdict in many tasks.
REJECTING_TAILS = (
    '\n<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call>',
    '\n<tool_call>\n{"name": "ls", "arguments": {"a": true}\n</tool_call>',
)


@pytest.mark.parametrize("kind", ["drop_call", "wrong_value", "extra_call", "swap_order"])
def test_release_verdicts_are_bfcls_on_the_calls_it_accepts(kind):
    """Release mode on a perturbed corpus with rejected replies injected, against BFCL's checker
    on the same corpus without them (what the release's evaluation hands BFCL's runner)."""
    rng = random.Random(kind)
    verdicts = []
    for task_id in all_task_ids():
        if task_id in needs_hidden_tools():
            continue
        turns = _perturb(kind, oracle_turns(load_task(task_id)), rng)
        if turns is None:
            continue
        with_calls = [i for i, messages in enumerate(turns) if "<tool_call>" in messages[0]]
        injected = [list(messages) for messages in turns]
        turn = rng.choice(with_calls)
        first_call = injected[turn][0].split("\n</tool_call>")[0] + "\n</tool_call>"
        injected[turn].insert(0, first_call + rng.choice(REJECTING_TAILS))
        ours = score(task_id, injected, mode="release").success
        assert ours == official_verdict(task_id, turns), (task_id, injected)
        verdicts.append(ours)
    assert len(verdicts) > 100
    assert any(verdicts) or kind not in ACCEPTING_KINDS
    assert not all(verdicts) or kind not in REJECTING_KINDS


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_scripted_policies_under_each_protocol(protocol):
    """The oracle passes every evaluation task except, under the release's protocol, those whose
    ground truth needs a tool before BFCL reveals it; the do-nothing policy passes none."""
    ids = split_ids("eval")
    episode = EpisodeConfig(mode=protocol)
    with EnvPool(load_task, PoolConfig(num_workers=2, episode=episode)) as pool:
        results = {
            policy: evaluate.run_episodes(
                evaluate.make_policy(policy, ids), ids, pool, renderer=RELEASE
            )
            for policy in ("oracle", "noop")
        }
    unsolvable = needs_hidden_tools() & set(ids) if protocol == "release" else set()
    assert {r.task_id for r in results["oracle"] if not r.success} == unsolvable
    assert not any(r.success for r in results["noop"])
    assert unsolvable <= {"multi_turn_miss_func_49"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_evaluation_command_takes_a_protocol(tmp_path, protocol):
    command = [sys.executable, "-m", "environments.bfcl.evaluate", f"--protocol={protocol}"]
    command += ["--policy=oracle", "--limit=4", "--num_workers=1", f"--workdir={tmp_path}"]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert (metrics["protocol"], metrics["prompt_style"], metrics["mean"]) == (
        protocol,
        "release",
        1.0,
    )
    line = json.loads((tmp_path / "transcripts.jsonl").read_text().splitlines()[0])
    assert line["transcript"][0]["content"] == bfcl_system_prompt(
        bfcl_entry(line["id"])[0]["function"]
    )


# ---- evaluation record and config --------------------------------------------------------------


def test_evaluation_runs_and_reports_every_protocol(monkeypatch):
    """seal_jax.evaluation with the rollout replaced by the oracle policy on the same pool."""
    seen = []

    def collect(
        engine, params, chat, pool, *, task_ids, num_samples, seed, renderer, chunk_tasks, slots
    ):
        seen.append((pool.config.episode.mode, renderer))
        policy = evaluate.make_policy("oracle", list(task_ids))
        results = evaluate.run_episodes(policy, list(task_ids), pool, renderer=renderer)
        return types.SimpleNamespace(results=results)

    monkeypatch.setattr(evaluation.episodes, "collect_episodes", collect)
    config = qwen.get_config()
    config.train.eval_limit = 8
    config.env.num_workers = 1
    record = evaluation.evaluate(None, None, None, get_source("bfcl"), config, step=0)
    assert seen == [("release", RELEASE), ("official", RELEASE)]
    assert record["protocol"] == "release" and list(record["protocols"]) == ["release", "official"]
    assert record["mean"] == record["protocols"]["release"]["mean"] == 1.0
    assert record["protocols"]["official"]["num_tasks"] == 8


@pytest.mark.parametrize("variant", list(base.VARIANTS))
def test_paper_preset_follows_the_release(variant):
    c = qwen.get_config(variant)
    assert c.env.train_mode == "release"
    assert c.env.instance_mismatch == "instantiated"
    assert c.interface.prompt_style == "release"
    assert tuple(c.train.eval_protocols) == ("release", "official")
    assert c.train.eval_max_new_tokens == c.rollout.max_new_tokens == 4096
    assert c.env.max_model_calls == 20 and c.rollout.context_limit == 16384
    config_lib.validate(c)


def test_cpu_default_keeps_its_protocol():
    c = tiny.get_config()
    assert c.interface.prompt_style == "chat_template"
    assert tuple(c.train.eval_protocols) == ("official",)
    assert c.env.instance_mismatch == "touched"  # the rule its figures were measured with


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("train.eval_protocols", ("release", "release"), "at most once"),
        ("train.eval_protocols", (), "at least one"),
        ("train.eval_protocols", ("bfcl",), "must be one of"),
        ("interface.prompt_style", "openai", "must be one of"),
        ("env.instance_mismatch", "classes", "must be one of"),
        ("env.train_mode", "strict", "must be one of"),
    ],
)
def test_bad_protocol_settings_are_one_clear_error(key, value, message):
    c = qwen.get_config()
    section, field = key.split(".")
    c[section][field] = value
    with pytest.raises(config_lib.ConfigError, match=message):
        config_lib.validate(c)


# The release's values, typed from exp/SEAL.yaml (and the defaults it inherits:
# external/config_fallback/ppo_trainer.yaml, het_fsdp_worker.py's AdamW betas):
# config key -> (release value, where it is set).
RELEASE_VALUES = {
    "optim.lr": (1e-6, "actor.optim.lr"),
    "optim.weight_decay": (0.01, "ppo_trainer.yaml actor.optim.weight_decay"),
    "optim.schedule": ("constant", "ppo_trainer.yaml warmup_style"),
    "optim.warmup_steps": (0, "ppo_trainer.yaml lr_warmup_steps_ratio 0.0"),
    "optim.b1": (0.9, "het_fsdp_worker.py betas default"),
    "optim.b2": (0.999, "het_fsdp_worker.py betas default"),
    "optim.grad_clip": (1.0, "actor.grad_clip"),
    "rl.group_size": (8, "rollout.n"),
    "rl.clip_low": (0.2, "actor.clip_ratio_low"),
    "rl.clip_high": (0.2, "actor.clip_ratio_high"),
    "rl.dual_clip": (10.0, "actor.clip_ratio_c"),
    "rl.kl_coef": (0.001, "actor.kl_loss_coef"),
    "rl.kl_estimator": ("k3", "actor.kl_loss_type low_var_kl"),
    "rl.entropy_coef": (0.0, "actor.entropy_coeff"),
    "rl.reward": ("binary", "tocf.feedback.dense_reward partial_credit_cap 0.0"),
    "train.batch_tasks": (32, "data.train_batch_size"),
    "train.mini_batch_tasks": (8, "actor.ppo_mini_batch_size"),
    "train.ppo_epochs": (1, "ppo_trainer.yaml actor.ppo_epochs"),
    "train.epochs": (6, "trainer.total_epochs"),
    "train.eval_every": (10, "trainer.test_freq"),
    "rollout.temperature": (1.0, "rollout.temperature"),
    "rollout.top_p": (1.0, "ppo_trainer.yaml rollout.top_p"),
    "rollout.top_k": (0, "ppo_trainer.yaml rollout.top_k -1 (off)"),
    "rollout.context_limit": (16384, "rollout.max_model_len"),
    "rollout.max_new_tokens": (4096, "data.max_response_length"),
    "train.eval_max_new_tokens": (4096, "data.max_response_length (validation too)"),
    "env.max_model_calls": (20, "rollout.multi_turn.max_steps"),
    "weighting.enabled": (True, "tocf.advantage.apatch.enable"),
    "weighting.closed_loop": (True, "apatch.dynamic.enable"),
    "weighting.beta": (0.25, "apatch.dynamic.ema_beta"),
    "weighting.alpha": (1.0, "apatch.dynamic.prevalence_alpha"),
    "weighting.confidence_k": (32, "apatch.dynamic.confidence_samples"),
    "weighting.mode": ("all", "apatch.apply_to"),
    "weighting.budget_enabled": (False, "apatch has no budget block"),
}
RELEASE_TAG_WEIGHTS = {  # tocf.advantage.apatch.tag_weights
    "spurious_tool_call": 2.0,
    "correct_abstention": 1.8,
    "empty_turn_model_response": 1.5,
    "state_mismatch": 1.0,
    "response_mismatch": 0.9,
    "instance_mismatch": 0.6,
    "pass": 1.0,
}


@pytest.mark.parametrize("key", list(RELEASE_VALUES))
def test_paper_preset_hyper_parameters_are_the_releases(key):
    section, field = key.split(".")
    assert qwen.get_config()[section][field] == RELEASE_VALUES[key][0]


def test_paper_preset_tag_utilities_and_weight_bounds_are_the_releases():
    from environments import weighting

    assert dict(qwen.get_config().weighting.rho0) == RELEASE_TAG_WEIGHTS
    assert (weighting.WEIGHT_MIN, weighting.WEIGHT_MAX) == (0.5, 2.0)  # apatch min/max_scale
    interface = qwen.get_config().interface  # observation_lite: required and enum cues only
    assert (interface.schema_cues, interface.schema_types) == ("static", False)
    assert {interface.affordance_cues, interface.error_hints, interface.guidelines} == {"off"}

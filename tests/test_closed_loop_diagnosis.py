"""benchmarks/closed_loop_diagnosis.py: what each step showed and the switch counts (synthetic
runs), and its tokenizer figure against the suite's tokenizer."""

import json

from benchmarks import closed_loop_diagnosis as diag
from environments.interface import COMPONENTS, HINTS


def _record(step, reward, active, tags=None):
    interface = {"active": {c: active.get(c, []) for c in COMPONENTS}}
    rollout = {"reward_mean": reward, "context_limit_fraction": 0.0, "tag_fraction": tags or {}}
    return {"step": step, "rollout": rollout, "interface": interface}


def test_trajectory_shows_the_previous_state_and_counts_switches(tmp_path):
    loop = [
        {"step": 0, "eval": {"mean": 0.5}},
        _record(1, 0.5, {"guidelines": ["state_mismatch"]}),
        _record(2, 0.2, {"affordance_cues": ["a", "b"], "guidelines": ["state_mismatch"]}),
        _record(3, 0.0, {"affordance_cues": ["b"]}),
    ]
    plain = [_record(s, 0.4, {}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in loop) + "\n")
    traj = diag.trajectory(diag.read_records(str(tmp_path)), plain)
    shown = [{c: len(r["shown"][c]) for c in COMPONENTS} for r in traj["steps"]]
    assert [s["affordance_cues"] for s in shown] == [0, 0, 2]  # the state after the step before
    assert [s["guidelines"] for s in shown] == [0, 1, 1]
    assert [r["plain_reward"] for r in traj["steps"]] == [0.4, 0.4, 0.4]
    assert traj["switches"]["affordance_cues"] == {"on": 2, "off": 1}
    assert traj["switches"]["guidelines"] == {"on": 1, "off": 1}
    assert diag.lowest_reward_state(loop)[0] == 3


def test_interface_text_costs_the_suite_tokenizer_more_tokens_per_character():
    """The diagnosis's tokenizer figure, against the suite's real tokenizer: the interface's
    fixed text (every hint filled in) packs fewer characters per token than task text."""
    from transformers import AutoTokenizer

    from environments.rendering import Renderer
    from environments.suite import load_tasks
    from environments.suite.tokenizer import TOKENIZER_DIR

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    texts = diag.component_texts()
    assert len(texts["error_hints"]) == len(HINTS)
    assert not any("{tool}" in t or "{argument" in t for t in texts["error_hints"])
    tasks = [Renderer().system(t.docs)["content"] for t in load_tasks("train")[:20]]
    plain = diag.chars_per_token(tokenizer, tasks)
    for component, text in texts.items():
        assert diag.chars_per_token(tokenizer, text) < 0.8 * plain, component

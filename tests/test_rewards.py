"""The reward kinds against a hand count."""

import numpy as np
import pytest

from environments.episode import EpisodeResult
from environments.rewards import episode_rewards

TAGS_AND_SUCCESS = [
    (["pass", "state_mismatch", "correct_abstention", "pass"], False),  # 2 of 3 graded turns
    (["pass", "correct_abstention"], True),
    (["spurious_tool_call"], False),  # no graded turn: falls back to the binary reward
    (["empty_turn_model_response", "instance_mismatch"], False),
    (["pass", "spurious_tool_call"], True),  # official success with a call where none was due
]
RESULTS = [
    EpisodeResult("t", "c", success, tags, [set()] * len(tags), [[]] * len(tags))
    for tags, success in TAGS_AND_SUCCESS
]


def test_binary_is_the_success_flag():
    np.testing.assert_array_equal(episode_rewards(RESULTS, "binary"), [0, 1, 0, 0, 1])


def test_strict_also_fails_a_call_where_none_was_due():
    np.testing.assert_array_equal(episode_rewards(RESULTS, "strict"), [0, 1, 0, 0, 0])


def test_progress_counts_passed_turns_with_a_ground_truth_call():
    np.testing.assert_allclose(episode_rewards(RESULTS, "progress"), [2 / 3, 1.0, 0.0, 0.0, 1.0])


def test_unknown_reward_kind():
    with pytest.raises(ValueError, match="unknown reward kind 'dense'"):
        episode_rewards(RESULTS, "dense")

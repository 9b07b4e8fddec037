"""The reward kinds against a hand count."""

from types import SimpleNamespace

import numpy as np
import pytest

from seal_jax.config import ConfigError
from seal_jax.trainer import episode_rewards

RESULTS = SimpleNamespace(
    rewards=np.array([0.0, 1.0, 0.0, 0.0, 1.0], np.float32),
    turn_tags=[
        ["pass", "state_mismatch", "correct_abstention", "pass"],  # 2 of 3 graded turns
        ["pass", "correct_abstention"],  # success
        ["spurious_tool_call"],  # no graded turn: falls back to the binary reward
        ["empty_turn_model_response", "instance_mismatch"],
        ["pass", "spurious_tool_call"],  # official success with a call where none was due
    ],
)


def test_binary_is_the_success_flag():
    np.testing.assert_array_equal(episode_rewards(RESULTS, "binary"), [0, 1, 0, 0, 1])


def test_strict_also_fails_a_call_where_none_was_due():
    np.testing.assert_array_equal(episode_rewards(RESULTS, "strict"), [0, 1, 0, 0, 0])


def test_progress_counts_passed_turns_with_a_ground_truth_call():
    np.testing.assert_allclose(episode_rewards(RESULTS, "progress"), [2 / 3, 1.0, 0.0, 0.0, 1.0])


def test_unknown_reward_kind():
    with pytest.raises(ConfigError, match="rl.reward"):
        episode_rewards(RESULTS, "dense")

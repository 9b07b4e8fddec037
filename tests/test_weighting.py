"""Host-side tag statistics, closed-loop utilities and trajectory weights (docs/method.md 3)."""

import json

import numpy as np
import pytest

from configs.base import base_config
from environments import weighting as w
from environments.episode import EpisodeResult
from environments.profile import FailureProfile, TagStatistics
from seal_jax import rl

EXCLUDED = ("gt_error", "checker_error")
TAGS = ("pass", "state_mismatch", "spurious_tool_call", "instance_mismatch", "gt_error", "odd_tag")


def rho0():
    return dict(base_config().weighting.rho0)


def reference_update(rho, episodes, rho0, beta=0.25, alpha=1.0, k=32):
    """docs/method.md section 3, written out independently from a list of (tags, reward)."""
    count, reward_sum = {}, {}
    for tags, reward in episodes:
        for tag in tags:
            count[tag] = count.get(tag, 0) + 1
            reward_sum[tag] = reward_sum.get(tag, 0.0) + reward
    n = sum(c for tag, c in count.items() if tag not in EXCLUDED)
    new = {}
    for tag in set(rho0) | set(rho) | set(count):
        if tag in EXCLUDED:
            target = 1.0
        elif tag == "pass":
            target = rho0["pass"]
        elif tag not in count:
            target = rho0.get(tag, 1.0)
        else:
            c = count[tag]
            stagnation = 1 - reward_sum[tag] / c
            target = rho0.get(tag, 1.0) * (1 + alpha * (c / n) * stagnation * min(1, c / k))
        target = min(2.0, max(0.5, target))
        new[tag] = (1 - beta) * rho.get(tag, rho0.get(tag, 1.0)) + beta * target
    return new


def random_episodes(rng, num):
    return [
        (list(rng.choice(TAGS, size=rng.integers(0, 5))), float(rng.integers(0, 2)))
        for _ in range(num)
    ]


def update(rho, stats, **kwargs):
    return w.update_utilities(
        rho, stats, rho0(), beta=0.25, alpha=1.0, confidence_k=32, excluded_tags=EXCLUDED, **kwargs
    )


def test_worked_example_of_the_method():
    stats = TagStatistics()
    for _ in range(36):  # prevalence 36 / 120 = 0.3, mean reward 0, count >= K
        stats.add_episode(["state_mismatch"], 0.0)
    for _ in range(84):
        stats.add_episode(["pass"], 1.0)
    rho = update(rho0(), stats)
    assert rho["state_mismatch"] == pytest.approx(1.075, abs=1e-9)
    rho = update(rho, stats)
    assert rho["state_mismatch"] == pytest.approx(1.131, abs=1e-3)
    assert rho["pass"] == 1.0


def test_update_matches_reference_over_several_steps():
    rng = np.random.default_rng(0)
    stats, episodes = TagStatistics(), []
    rho, expected = rho0(), rho0()
    for _ in range(4):
        new = random_episodes(rng, 30)
        episodes += new
        for tags, reward in new:
            stats.add_episode(tags, reward)
        rho, expected = update(rho, stats), reference_update(expected, episodes, rho0())
        assert rho.keys() == expected.keys()
        for tag in rho:
            assert rho[tag] == pytest.approx(expected[tag], abs=1e-12)
    assert set(rho) >= {"odd_tag", "gt_error"}


def test_window_resets_per_epoch_and_falls_back_to_totals():
    stats = TagStatistics()
    stats.add_episode(["state_mismatch", "state_mismatch", "pass"], 0.0)
    stats.add_episode(["pass"], 1.0)
    assert stats.summary() == {"state_mismatch": (2, 0.0), "pass": (2, 0.5)}
    stats.end_epoch()
    assert stats.summary() == {"state_mismatch": (2, 0.0), "pass": (2, 0.5)}
    stats.add_episode(["instance_mismatch"], 1.0)
    assert stats.summary() == {"instance_mismatch": (1, 1.0)}
    assert stats.total_count == {"state_mismatch": 2, "pass": 2, "instance_mismatch": 1}


def test_statistics_round_trip_through_json():
    stats = TagStatistics()
    for tags, reward in random_episodes(np.random.default_rng(1), 20):
        stats.add_episode(tags, reward)
    stats.end_epoch()
    stats.add_episode(["pass"], 1.0)
    restored = TagStatistics.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert restored == stats
    with pytest.raises(ValueError, match="missing"):
        TagStatistics.from_dict({"window_count": {}})


def test_static_switch_keeps_rho0():
    stats = TagStatistics()
    stats.add_episode(["state_mismatch"] * 40, 0.0)
    assert update({"state_mismatch": 1.7}, stats, closed_loop=False) == rho0()


def reference_weight(tags, rho):
    values = [rho.get(t, 1.0) for t in tags if t not in EXCLUDED]
    return 1.0 if not values else min(2.0, max(0.5, sum(values) / len(values)))


def test_trajectory_weights_match_reference_and_keep_signs():
    rng = np.random.default_rng(2)
    rho = {"pass": 1.0, "state_mismatch": 1.3, "spurious_tool_call": 2.0, "instance_mismatch": 0.6}
    tags = [list(rng.choice(TAGS, size=rng.integers(0, 5))) for _ in range(64)]
    tags += [[], ["gt_error"], ["spurious_tool_call"] * 3, ["instance_mismatch"] * 2]
    weights = w.trajectory_weights(tags, rho, excluded_tags=EXCLUDED)
    expected = [reference_weight(t, rho) for t in tags]
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    assert weights.dtype == np.float32 and weights[-4:-2].tolist() == [1.0, 1.0]
    advantages = rng.normal(size=len(tags))
    assert np.all(np.sign(advantages * weights) == np.sign(advantages))


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_modes_weight_only_one_sign(mode):
    """The mode is applied where the advantages live (seal_jax.rl), from the host's weights."""
    tags = [["spurious_tool_call"], ["instance_mismatch"], ["spurious_tool_call"], []]
    rho = {"spurious_tool_call": 2.0, "instance_mismatch": 0.6}
    advantages = np.array([1.0, -1.0, 0.0, -2.0], np.float32)
    full = np.array([2.0, 0.6, 2.0, 1.0])
    np.testing.assert_allclose(w.trajectory_weights(tags, rho), full, rtol=1e-6)
    got = rl.weighted_advantages(advantages, w.trajectory_weights(tags, rho), mode)
    keep = advantages > 0 if mode == "positive" else advantages < 0
    np.testing.assert_allclose(got, advantages * np.where(keep, full, 1.0), rtol=1e-6)


def test_budget_shrinks_clamps_and_renormalises_tagged_weights():
    tags = [["spurious_tool_call"], ["instance_mismatch"], ["state_mismatch"], [], ["gt_error"]]
    rho = {"spurious_tool_call": 2.0, "instance_mismatch": 0.5, "state_mismatch": 1.2}
    got = w.trajectory_weights(
        tags,
        rho,
        excluded_tags=EXCLUDED,
        budget_enabled=True,
        budget_strength=1.0,
        budget_clamp=1.4,
    )
    shrunk = np.array([1.5, 0.75, 1.1])  # 1 + (w - 1) / (1 + strength)
    clamped = np.clip(shrunk, 1 / 1.4, 1.4)
    np.testing.assert_allclose(got, [*(clamped / clamped.mean()), 1.0, 1.0], rtol=1e-6)
    assert got[:3].mean() == pytest.approx(1.0)


def test_cause_utilities_join_the_mean_only_when_given():
    tags, causes = [["state_mismatch", "pass"]], [["argument_mismatch"]]
    rho, cause_rho = {"state_mismatch": 1.4, "pass": 1.0}, {"argument_mismatch": 1.9}
    plain = w.trajectory_weights(tags, rho, causes_per_trajectory=causes)
    with_causes = w.trajectory_weights(
        tags, rho, causes_per_trajectory=causes, cause_utilities=cause_rho
    )
    assert plain[0] == pytest.approx(1.2) and with_causes[0] == pytest.approx(4.3 / 3)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="weighting mode"):
        rl.weighted_advantages(np.ones(1), np.ones(1), "both")
    with pytest.raises(ValueError, match="causes"):
        w.trajectory_weights([["pass"]], {}, cause_utilities={})
    with pytest.raises(ValueError, match="budget"):
        w.trajectory_weights(
            [["gt_error"]], {}, excluded_tags=EXCLUDED, budget_enabled=True, budget_clamp=0.9
        )


def test_weight_metrics():
    weights = np.array([0.5, 1.0, 2.0, 1.5])
    metrics = w.weight_metrics(weights)
    assert metrics["weight_ess"] == pytest.approx(5.0**2 / 7.5)
    assert (metrics["weight_min"], metrics["weight_max"]) == (0.5, 2.0)
    assert w.weight_metrics(np.ones(7))["weight_ess"] == pytest.approx(7.0)


def as_results(episodes, causes=()):
    """EpisodeResults with the given (tags, reward) and one set of causes on their first turn."""
    return [
        EpisodeResult("t", "c", bool(reward), tags, [set(causes)] + [set()] * (len(tags) - 1), [])
        for tags, reward in episodes
    ]


def test_diagnosis_weighting_end_to_end_and_checkpoint():
    config = base_config().weighting
    weighting, profile = w.DiagnosisWeighting(config), FailureProfile()
    episodes = random_episodes(np.random.default_rng(3), 40)
    results = as_results(episodes)
    profile.add(results, [reward for _, reward in episodes])
    weighting.update(profile)
    expected = reference_update(rho0(), episodes, rho0())
    assert weighting.utilities == pytest.approx(expected)
    assert weighting.metrics()["utility/state_mismatch"] == pytest.approx(
        expected["state_mismatch"]
    )
    weights = weighting.weights(results[:8])
    reference = [reference_weight(tags, expected) for tags, _ in episodes[:8]]
    np.testing.assert_allclose(weights, reference, rtol=1e-6)

    restored = w.DiagnosisWeighting.from_dict(config, json.loads(json.dumps(weighting.to_dict())))
    assert restored.to_dict() == weighting.to_dict()
    copy = FailureProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert copy == profile
    copy.end_epoch()
    assert copy.tags.window_count == {} and copy.tags.total_count == profile.tags.total_count

    config.enabled = False
    np.testing.assert_array_equal(w.DiagnosisWeighting(config).weights(results[:8]), 1.0)


def test_fine_causes_are_counted_per_turn_and_weigh_in_only_when_switched_on():
    config = base_config().weighting
    profile = FailureProfile()
    results = as_results(
        [(["state_mismatch", "pass"], 0.0)], ["missing_tool_call", "argument_mismatch"]
    )
    profile.add(results, [0.0])
    assert profile.causes.total_count == {"argument_mismatch": 1, "missing_tool_call": 1}
    weighting = w.DiagnosisWeighting(config)
    weighting.update(profile)
    plain = weighting.weights(results)
    config.cause_utilities = True
    with_causes = w.DiagnosisWeighting.from_dict(config, weighting.to_dict()).weights(results)
    rho, causes = weighting.utilities, weighting.cause_utilities
    values = [rho["state_mismatch"], rho["pass"], *causes.values()]
    assert plain[0] == pytest.approx((rho["state_mismatch"] + rho["pass"]) / 2)
    assert with_causes[0] == pytest.approx(sum(values) / len(values))

"""The statistics and the report of benchmarks/seal_vs_baselines.py, against independent
derivations (scipy, hand-computed values, exact bootstrap distributions) and synthetic runs."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from scipy import stats

from benchmarks import seal_vs_baselines as svb
from tests.devices import REPO


def test_paired_differences_pair_by_seed_and_drop_unmatched():
    seeds, d = svb.paired_differences({0: 0.5, 1: 0.7, 3: 0.9}, {1: 0.6, 0: 0.25, 2: 0.1})
    assert seeds == [0, 1]
    np.testing.assert_allclose(d, [0.25, 0.1])


def test_t_interval_hand_computed():
    # mean 3, sd sqrt(2.5), se sqrt(0.5), t_{4, 0.975} = 2.776445105
    lo, hi = svb.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451051977934 * math.sqrt(0.5)
    assert lo == pytest.approx(3 - half, abs=1e-9) and hi == pytest.approx(3 + half, abs=1e-9)
    assert (lo, hi) == pytest.approx((1.0367568385, 4.9632431615), abs=1e-9)


@pytest.mark.parametrize("n", [2, 3, 10, 25])
def test_t_interval_matches_scipy_ttest_rel(n):
    rng = np.random.default_rng(n)
    a, b = rng.normal(0.6, 0.05, n), rng.normal(0.58, 0.05, n)
    want = stats.ttest_rel(a, b).confidence_interval(0.95)
    _, d = svb.paired_differences(dict(enumerate(a)), dict(enumerate(b)))
    assert svb.t_interval(d) == pytest.approx((want.low, want.high), abs=1e-12)
    want90 = stats.ttest_rel(a, b).confidence_interval(0.90)
    assert svb.t_interval(d, 0.90) == pytest.approx((want90.low, want90.high), abs=1e-12)


def test_intervals_degenerate_cases():
    assert all(math.isnan(x) for x in svb.t_interval([0.3]))
    assert all(math.isnan(x) for x in svb.bootstrap_interval([0.3]))
    assert svb.t_interval([0.02] * 4) == pytest.approx((0.02, 0.02))
    assert svb.bootstrap_interval([0.02] * 4) == pytest.approx((0.02, 0.02))


def test_bootstrap_exact_small_distributions():
    # n = 2, [0, 1]: resample means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    assert svb.bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    # n = 3, [0, 0, 3]: P(mean = 0) = 8/27 > 2.5%, P(mean = 3) = 1/27 > 2.5%
    assert svb.bootstrap_interval([0.0, 0.0, 3.0]) == (0.0, 3.0)
    # n = 3, [0, 3, 3]: P(mean = 0) = 1/27, P(mean = 3) = 8/27
    assert svb.bootstrap_interval([0.0, 3.0, 3.0]) == (0.0, 3.0)


def test_bootstrap_re_derived_and_close_to_scipy():
    d = np.random.default_rng(3).normal(0.02, 0.03, 10)  # distinct resample means: no ties
    got = svb.bootstrap_interval(d)
    assert got == svb.bootstrap_interval(d)  # fixed RNG seed: reproducible
    assert got != svb.bootstrap_interval(d, seed=1)
    # a loop over resamples drawn as documented
    idx = np.random.default_rng(svb.BOOTSTRAP_SEED).integers(0, d.size, (10_000, d.size))
    means = sorted(float(np.mean([d[i] for i in row])) for row in idx)
    pos = 0.025 * (len(means) - 1)  # linear interpolation between order statistics
    lo = means[int(pos)] + (pos - int(pos)) * (means[int(pos) + 1] - means[int(pos)])
    assert got[0] == pytest.approx(lo, abs=1e-12)
    # scipy's percentile bootstrap with its own resamples: equal up to Monte-Carlo error
    ref = stats.bootstrap((d,), np.mean, method="percentile", n_resamples=10_000, rng=7)
    sd_mean = d.std(ddof=1) / math.sqrt(d.size)
    ci = ref.confidence_interval
    assert got == pytest.approx((ci.low, ci.high), abs=0.15 * sd_mean)
    # and both bracket the mean, inside the t interval's neighbourhood
    t_lo, t_hi = svb.t_interval(d)
    assert t_lo - sd_mean < got[0] < d.mean() < got[1] < t_hi + sd_mean


def test_paired_summary():
    s = svb.paired_summary({0: 0.7, 1: 0.6, 2: 0.5}, {0: 0.6, 1: 0.6, 2: 0.4})
    assert s["n"] == 3 and s["seeds"] == [0, 1, 2]
    assert s["mean"] == pytest.approx(0.2 / 3)
    assert s["sd"] == pytest.approx(np.std([0.1, 0.0, 0.1], ddof=1))
    assert s["t_interval"] == pytest.approx(list(svb.t_interval([0.1, 0.0, 0.1])))


def _step(weights, tag_fraction, utilities=None):
    w = np.asarray(weights, float)
    return {
        "rollout": {"tag_fraction": tag_fraction},
        "weights": {
            "weight_mean": float(w.mean()),
            "weight_min": float(w.min()),
            "weight_max": float(w.max()),
            "weight_ess": float(w.sum() ** 2 / np.sum(w**2)),
        },
        "utilities": utilities or {},
    }


def test_weight_stats_from_step_summaries_bound_what_they_cannot_know():
    steps = [[1.0, 1.0, 1.0, 1.0], [1.5, 1.2, 1.0, 1.0], [0.6, 1.0, 1.3, 1.0], [1.5] * 4]
    train = [_step(w, {}) for w in steps]
    w = svb.weight_summary([{"weights": svb.run_weight_stats(train, rows=4)}])
    flat = np.concatenate(steps)
    assert w["rows"] == 16 and not w["exact"] and w["quantiles"] is None
    assert w["mean"] == pytest.approx(flat.mean()) and w["sd"] == pytest.approx(flat.std())
    assert (w["min"], w["max"]) == (0.6, 1.5)
    true_share = np.mean(flat != 1.0)  # 8 / 16
    low, high = w["share_ne1"]
    assert low <= true_share <= high
    assert (low, high) == pytest.approx(((0 + 1 + 2 + 4) / 16, (0 + 3 + 4 + 4) / 16))


def test_weight_and_tag_stats_from_trajectory_records_are_exact():
    train = []
    for weights, cats, tags in [
        ([1.0, 1.5], ["base", "miss_func"], [["pass", "pass"], ["spurious_tool_call"]]),
        ([0.6, 1.0], ["base", "miss_func"], [["instance_mismatch"], ["correct_abstention"]]),
    ]:
        record = _step(weights, {"pass": 0.5})
        record["trajectories"] = {"weight": weights, "category": cats, "tags": tags}
        train.append(record)
    w = svb.weight_summary([{"weights": svb.run_weight_stats(train, rows=2)}])
    assert w["exact"] and w["share_ne1"] == [0.5, 0.5]
    assert w["quantiles"]["q50"] == pytest.approx(np.quantile([1.0, 1.5, 0.6, 1.0], 0.5))
    tags = svb.run_tag_stats(train, counts=None)
    assert tags["count"] == {"pass": 2, "spurious_tool_call": 1, "instance_mismatch": 1,
                             "correct_abstention": 1}  # fmt: skip
    got = svb.category_tag_counts([], train)["train"]
    assert got == {"base": {"pass": 2, "instance_mismatch": 1},
                   "miss_func": {"spurious_tool_call": 1, "correct_abstention": 1}}  # fmt: skip


def test_acted_on_tags_follow_the_logged_utilities():
    train = [_step([1.0], {}, {"utility/pass": 1.0, "utility/state_mismatch": 1.0}),
             _step([1.0], {}, {"utility/pass": 1.0, "utility/state_mismatch": 1.07})]  # fmt: skip
    assert svb.acted_on_tags(train, {"weighting": {"enabled": True}}) == {"state_mismatch"}
    assert svb.acted_on_tags(train, {"weighting": {"enabled": False}}) == set()


# ---- the report from synthetic runs ----------------------------------------------------------

CATEGORIES = ("base", "miss_func")


def _write_run(root, arm, seed, final, weighting=True, finished=True, args=None):
    path = os.path.join(root, f"{arm}_seed{seed}")
    os.makedirs(os.path.join(path, "warm_start"))
    with open(os.path.join(path, "warm_start", "model.safetensors"), "wb") as f:
        f.write(f"warm start of seed {seed}".encode())
    if args is not None:
        with open(os.path.join(path, "run_args.json"), "w") as f:
            json.dump(args, f)
    config = {"seed": seed, "train": {"batch_tasks": 1}, "rl": {"group_size": 2},
              "weighting": {"enabled": weighting}}  # fmt: skip
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**config, "arm": arm}, f)

    def evaluation(step, acc):
        return {"step": step, "eval": {
            "accuracy": dict(zip(CATEGORIES, acc)), "mean": float(np.mean(acc)),
            "strict_accuracy": dict(zip(CATEGORIES, acc)), "strict_mean": float(np.mean(acc)),
            "tag_histogram": {"base": {"pass": 2, "empty_turn_model_response": 1},
                              "miss_func": {"pass": 3}}}}  # fmt: skip

    weights = [1.5, 1.0] if weighting else [1.0, 1.0]
    utilities = {"utility/pass": 1.0, "utility/empty_turn_model_response": 1.5}
    step = _step(weights, {"pass": 0.75, "empty_turn_model_response": 0.25}, utilities)
    lines = [evaluation(0, (0.5, 0.5)), {**step, **evaluation(1, final)} if finished else step]
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(line) for line in lines) + "\n")
    if finished:
        with open(os.path.join(path, "wall_s"), "w") as f:
            f.write("12.5")


def test_report_only_reports_the_finished_runs(tmp_path):
    root = str(tmp_path / "runs")
    for seed, (s, v) in enumerate([(0.7, 0.6), (0.6, 0.6), (0.8, 0.5)]):
        _write_run(root, "seal", seed, (s, s))
        _write_run(root, "vanilla_grpo", seed, (v, v), weighting=False)
    _write_run(root, "seal", 3, (0.9, 0.9))  # no vanilla_grpo partner: unpaired
    _write_run(root, "vanilla_grpo", 4, (0.1, 0.1), finished=False)  # unfinished: ignored
    out = str(tmp_path / "out")
    text = svb.write_report(out, root, ["seal", "vanilla_grpo", "closed_loop"], "configs/tiny.py")
    for name in ("results.md", "results.json", "comparison.png", "paired_differences.png"):
        assert os.path.isfile(os.path.join(out, name)), name
    assert "| seal | 4 | 0, 1, 2, 3 |" in text and "| vanilla_grpo | 3 | 0, 1, 2 |" in text
    assert "| closed_loop | 0 |" in text
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    p = results["paired"]["seal"]["official"]["mean"]
    assert p["n"] == 3 and p["diffs"] == pytest.approx([0.1, 0.0, 0.3])
    assert p["t_interval"] == pytest.approx(list(svb.t_interval([0.1, 0.0, 0.3])))
    assert p["bootstrap_interval"] == pytest.approx(list(svb.bootstrap_interval([0.1, 0.0, 0.3])))
    # the tags and weights of the training steps
    assert results["tags"]["seal"]["share"] == {"empty_turn_model_response": 0.25, "pass": 0.75}
    assert results["weights"]["vanilla_grpo"]["share_ne1"] == [0.0, 0.0]
    assert results["weights"]["seal"]["mean"] == pytest.approx(1.25)
    # miss_func never shows empty_turn_model_response, the one tag with a utility != 1
    assert results["categories"]["seal"]["eval"]["miss_func"] == [24, 0]
    assert "never produced a tag the weighting acts on:** seal (eval): miss_func" in text
    assert "vanilla_grpo: weighting off" in text


def test_another_baseline_pairs_every_other_arm_with_it(tmp_path):
    root = str(tmp_path / "runs")
    finals = {
        "seal": (0.7, 0.6, 0.8),
        "vanilla_grpo": (0.6, 0.6, 0.5),
        "closed_loop": (0.2, 0.4, 0.3),
    }
    for arm, values in finals.items():
        for seed, v in enumerate(values):
            _write_run(root, arm, seed, (v, v), weighting=arm != "vanilla_grpo")
    out = str(tmp_path / "out")
    text = svb.write_report(out, root, list(finals), "configs/tiny.py", baseline="closed_loop")
    results = svb.read_json(os.path.join(out, "results.json"))
    assert results["baseline"] == "closed_loop" and set(results["paired"]) == {
        "seal",
        "vanilla_grpo",
    }
    assert "## Paired differences to closed_loop" in text and "| arm − closed_loop |" in text
    p = results["paired"]["vanilla_grpo"]["official"]["mean"]
    assert p["diffs"] == pytest.approx([0.4, 0.2, 0.2])
    t = stats.ttest_rel(finals["vanilla_grpo"], finals["closed_loop"])
    assert p["t_interval"] == pytest.approx(list(t.confidence_interval(0.95)))


def test_a_baseline_outside_the_arms_is_one_usage_error(tmp_path):
    from absl.testing import flagsaver

    _parsed_flags()
    saved = flagsaver.flagsaver(
        arms=["seal", "vanilla_grpo"], baseline="closed_loop", report_only=True,
        out_dir=str(tmp_path),
    )  # fmt: skip
    refused = pytest.raises(svb.app.UsageError, match="--baseline=closed_loop is not one of")
    with saved, refused:
        svb.main([])


def _parsed_flags():
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["seal_vs_baselines"])


def test_recorded_runs_report_like_the_run_directories_they_came_from(tmp_path):
    """An earlier session's results.json stands in for its lost run directories: the merged
    report's paired statistics and sums equal those of one report over all run directories."""
    _parsed_flags()
    arms = ["seal", "vanilla_grpo"]
    finals = {0: (0.7, 0.6), 1: (0.6, 0.6), 2: (0.8, 0.5), 3: (0.9, 0.4)}

    def write(root, seed):
        s, v = finals[seed]
        _write_run(root, "seal", seed, (s, s), args=svb.run_args("seal", seed))
        _write_run(root, "vanilla_grpo", seed, (v, v), weighting=False,
                   args=svb.run_args("vanilla_grpo", seed))  # fmt: skip

    everything, earlier, later = (str(tmp_path / n) for n in ("all", "earlier", "later"))
    for seed in finals:
        write(everything, seed)
        write(earlier if seed < 2 else later, seed)
    _write_run(later, "seal", 1, (0.6, 0.6), args=svb.run_args("seal", 1))  # rerun: same result
    svb.write_report(str(tmp_path / "r_earlier"), earlier, arms, "configs/tiny.py")
    recorded = svb.read_recorded([str(tmp_path / "r_earlier" / "results.json")], arms)
    assert sorted(recorded["seal"]) == [0, 1] and sorted(recorded["vanilla_grpo"]) == [0, 1]
    text = svb.write_report(str(tmp_path / "r_merged"), later, arms, "configs/tiny.py", recorded)
    svb.write_report(str(tmp_path / "r_all"), everything, arms, "configs/tiny.py")
    merged, whole = (
        svb.read_json(str(tmp_path / d / "results.json")) for d in ("r_merged", "r_all")
    )
    assert "| seal | 4 | 0, 1, 2, 3 | 0 |" in text  # seed 1's run directory wins
    assert "| vanilla_grpo | 4 | 0, 1, 2, 3 | 0, 1 |" in text
    assert merged["paired"] == whole["paired"] and merged["tags"] == whole["tags"]
    for key in ("rows", "mean", "sd", "min", "max", "share_ne1"):
        assert merged["weights"]["seal"][key] == pytest.approx(whole["weights"]["seal"][key])
    assert merged["categories"] == whole["categories"]


def test_the_committed_study_record_reproduces_its_report(tmp_path):
    """benchmarks/README.md's final tables come from this file: reported from the record alone
    they come out the same, and the primary comparison re-derives with scipy."""
    _parsed_flags()
    path = os.path.join(REPO, "benchmarks", "results", "seal_vs_baselines_study_seeds0-9.json")
    committed = svb.read_json(path)
    arms = list(committed["arms"])
    recorded = svb.read_recorded([path], arms)
    svb.write_report(
        str(tmp_path / "out"), str(tmp_path / "runs"), arms, "configs/tiny.py", recorded
    )
    again = svb.read_json(str(tmp_path / "out" / "results.json"))
    for key in ("paired", "tags", "weights", "categories", "checks"):
        assert again[key] == committed[key], key
    assert committed["checks"] == []  # one warm start per seed, one flag set per arm
    runs = {arm: {r["seed"]: r for r in committed["runs"][arm]} for arm in arms}
    assert all(sorted(runs[arm]) == list(range(10)) for arm in arms)
    diffs = [
        runs["seal"][s]["final"]["mean"] - runs["vanilla_grpo"][s]["final"]["mean"]
        for s in range(10)
    ]
    t = stats.ttest_rel(
        [runs["seal"][s]["final"]["mean"] for s in range(10)],
        [runs["vanilla_grpo"][s]["final"]["mean"] for s in range(10)],
    )
    primary = committed["paired"]["seal"]["official"]["mean"]
    assert primary["diffs"] == pytest.approx(diffs)
    assert primary["t_interval"] == pytest.approx(list(t.confidence_interval(0.95)))


def test_recorded_runs_are_not_run_again_but_a_missing_warm_start_is_rebuilt(tmp_path):
    _parsed_flags()
    order = ["released_interface", "seal", "vanilla_grpo"]
    recorded = {"released_interface": {5: {}}, "seal": {5: {}, 6: {}},
                "vanilla_grpo": {6: {}}}  # fmt: skip
    root = str(tmp_path / "runs")
    assert svb.to_run(root, order, 4, recorded) == order
    assert svb.to_run(root, order, 6, recorded) == ["released_interface"]
    # seed 5's vanilla_grpo needs the warm start, which only the recorded builder had
    assert svb.to_run(root, order, 5, recorded) == ["released_interface", "vanilla_grpo"]
    for shared in svb.SHARED:
        os.makedirs(os.path.join(root, "released_interface_seed5", shared))
        with open(os.path.join(root, "released_interface_seed5", shared, "config.json"), "w"):
            pass
    assert svb.to_run(root, order, 5, recorded) == ["vanilla_grpo"]
    for arm in order:
        recorded[arm][7] = {}
    assert svb.to_run(root, order, 7, recorded) == []


def test_recorded_runs_with_other_flags_are_refused(tmp_path):
    _parsed_flags()
    root = str(tmp_path / "runs")
    _write_run(root, "seal", 0, (0.5, 0.5), args=svb.run_args("seal", 0) + ["--config.x=1"])
    svb.write_report(str(tmp_path / "r"), root, ["seal"], "configs/tiny.py")
    with pytest.raises(svb.app.UsageError, match="other flags"):
        svb.read_recorded([str(tmp_path / "r" / "results.json")], ["seal"])
    with pytest.raises(svb.app.UsageError, match="not a results.json"):
        svb.read_recorded([str(tmp_path / "r" / "results.md")], ["seal"])


def test_report_with_no_finished_run(tmp_path):
    text = svb.write_report(str(tmp_path), str(tmp_path / "none"), ["seal"], "configs/tiny.py")
    assert "No finished run yet" in text


def test_arms():
    assert set(svb.STUDY_ARMS) <= set(svb.ARMS) and svb.BASELINE in svb.STUDY_ARMS
    assert svb.ARMS["released_interface"] == ("seal", ("--config.interface.schema_cues=static",))
    for variant in svb.VARIANTS:
        assert svb.ARMS[variant] == (variant, ())


def test_the_warm_start_is_built_by_the_arm_whose_fixed_views_the_others_need():
    """The study's shared warm start comes from the arm with a static component (the released
    schema cues, shown from step one); a closed-loop re-measurement's from the closed loop."""
    _parsed_flags()
    assert svb.interface_modes("released_interface")["schema_cues"] == "static"
    assert set(svb.interface_modes("seal").values()) == {"off"}  # configs/tiny.py: plain
    order = svb.warm_start_order(list(reversed(svb.STUDY_ARMS)))
    assert order[:2] == ["no_reweighting_released", "released_interface"]
    assert order[2] == "closed_loop"
    assert svb.warm_start_order(["seal", "closed_loop"]) == ["closed_loop", "seal"]

"""The official BFCL multi-turn checks, re-implemented without `eval`.

After each user turn with a non-empty ground truth, the model must have made a call, every
public attribute of every ground-truth instance must equal the model's, and the turn's
ground-truth results must all appear (unordered, with multiplicity) among the model's results
of this and all earlier turns.
"""


def state_differences(model: dict[str, object], truth: dict[str, object]) -> dict[str, list]:
    """Returns, per class, the public attributes whose values differ (empty when equal)."""
    differences = {}
    for class_name, truth_instance in truth.items():
        model_instance = model[class_name]
        differing = [
            name
            for name, value in vars(truth_instance).items()
            if not name.startswith("_") and getattr(model_instance, name) != value
        ]
        if differing:
            differences[class_name] = differing
    return differences


def missing_results(truth_results: list[str], model_results: list[str]) -> list[str]:
    """Returns the ground-truth results not found in the model's (multiset, any order)."""
    remaining = list(model_results)
    missing = []
    for result in truth_results:
        if result in remaining:
            remaining.remove(result)
        else:
            missing.append(result)
    return missing

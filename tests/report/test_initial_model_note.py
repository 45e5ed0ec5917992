"""The footer line on the initial model every interval is conditional on (rlvrlab.report.render.initial_model_note),
from the runs' params as MLflow returns them (strings; null is "None")."""

from rlvrlab.report.collect import Group, SeedRun
from rlvrlab.report.render import initial_model_note


def _group(label: str, seeds: range, **params: str) -> Group:
    runs = [SeedRun(f"{label}-{s}", s, {"seed": str(s), **params}, "abc1234", "FINISHED") for s in seeds]
    return Group(f"hash-{label}", runs, label=label)


def test_the_footer_says_whether_the_initial_model_varies_with_the_seed() -> None:
    tiny = {"model.tier": "tiny"}
    varies = [_group(a, range(5), **tiny, **{"model.warm_start_seed": "None"}) for a in ("grpo", "ucpo")]
    assert initial_model_note(varies) == "initial model: warm start seed = run seed (varies with seed)"
    fixed = [_group(a, range(5), **tiny, **{"model.warm_start_seed": "7"}) for a in ("grpo", "ucpo")]
    assert initial_model_note(fixed) == "fixed warm start seed 7: intervals are conditional on that one initial model"
    # runs logged before the key existed all started from warm start seed 0
    assert initial_model_note([_group("grpo", range(3), **tiny)]) == \
        "fixed warm start seed 0: intervals are conditional on that one initial model"
    assert initial_model_note([_group("grpo", range(3), **{"model.tier": "toy"})]) == \
        "initial model: the toy table of model.toy_init (no seed): intervals are conditional on that one initial model"
    real = {"model.tier": "real", "model.path": "/models/qwen3-8b", "model.warm_start_seed": "None"}
    assert initial_model_note([_group("grpo", range(3), **real)]) == \
        "initial model: model.path /models/qwen3-8b: intervals are conditional on that one initial model"
    mixed = [varies[0], _group("dapo", range(5), **tiny, **{"model.warm_start_seed": "0"})]
    assert initial_model_note(mixed) == ("initial model: warm start seed = run seed (varies with seed) (grpo); fixed "
                                         "warm start seed 0 (dapo); where it is fixed, intervals are conditional on "
                                         "that one initial model")


def test_a_command_sweeps_runs_say_the_initial_model_is_not_rlvrlabs_to_state() -> None:
    """A command sweep's runs (TRL, verl) log the trainer's params, not rlvrlab's model.*: no warm-start claim."""
    trl = [_group(a, range(2), learning_rate=a) for a in ("1e-05", "0.0001")]
    assert initial_model_note(trl) == ("initial model: not recorded by rlvrlab (another trainer's command; whether it "
                                       "varies with the seed is that trainer's doing)")

"""rlvrlab's MLflow experiments are marked as model training (MLflow's `mlflow.experimentKind` tag) wherever rlvrlab
creates or reuses one, and the UI address rlvrlab prints asks for the Model training view. The names are checked
against the installed MLflow UI's own code; bench/mlflow_ui_check.py checks the pages in a headless browser."""

from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from rlvrlab.tracking.mlflow_tracker import (
    EXPERIMENT_KIND,
    MODEL_TRAINING,
    UI_MODEL_TRAINING,
    MlflowTracker,
    experiment_id_for,
    quiet_client,
    ui_address,
    ui_hint,
)


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def kind(uri: str, experiment_id: str) -> str | None:
    return MlflowClient(tracking_uri=uri).get_experiment(experiment_id).tags.get(EXPERIMENT_KIND)


def test_a_new_experiment_is_model_training(uri, tmp_path):
    experiment_id = experiment_id_for(quiet_client(uri), "study", tmp_path / "artifacts")
    assert kind(uri, experiment_id) == "custom_model_development"


def test_an_old_experiment_gets_the_tag_on_its_next_use_and_a_chosen_kind_is_kept(uri):
    client = MlflowClient(tracking_uri=uri)
    old = client.create_experiment("made-before")
    chosen = client.create_experiment("genai", tags={EXPERIMENT_KIND: "genai_development"})
    assert kind(uri, old) is None
    assert experiment_id_for(quiet_client(uri), "made-before", None) == old
    assert kind(uri, old) == MODEL_TRAINING
    experiment_id_for(quiet_client(uri), "genai", None)
    assert kind(uri, chosen) == "genai_development"


def test_a_resumed_run_marks_its_experiment(uri):
    client = MlflowClient(tracking_uri=uri)
    old = client.create_experiment("before")
    run_id = client.create_run(old).info.run_id
    tracker = MlflowTracker(uri, "before", artifact_root=None, run_id=run_id)
    tracker.finish("FINISHED")
    assert kind(uri, old) == MODEL_TRAINING


def test_the_printed_address_opens_the_runs_in_the_model_training_view(uri):
    tracker = MlflowTracker(uri, "exp", artifact_root=None)
    tracker.finish("FINISHED")
    experiment_id = MlflowClient(tracking_uri=uri).get_experiment_by_name("exp").experiment_id
    assert ui_address(experiment_id) == (f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs"
                                         "?workflowType=machine_learning")
    assert ui_hint(uri, tracker.run_id) == (f"mlflow ui --backend-store-uri {uri}  then open "
                                            f"{ui_address(experiment_id)}")


def test_the_names_are_those_of_the_installed_mlflow_ui():
    """MLflow has no Python constant for them: its UI's bundle holds the tag name, the model-training value of its
    ExperimentKind enum, and the workflowType query of its GenAI / Model training switch."""
    bundle = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    code = "".join(path.read_text(encoding="utf-8", errors="replace") for path in bundle.glob("*.js"))
    assert f'"{EXPERIMENT_KIND}"' in code
    assert f'CUSTOM_MODEL_DEVELOPMENT="{MODEL_TRAINING}"' in code
    key, value = UI_MODEL_TRAINING.split("=")
    assert f'get("{key}")' in code and f'MACHINE_LEARNING="{value}"' in code

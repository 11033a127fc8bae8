"""The in-process federation learns, rejects a label-flipping minority, and its CLI behaves."""

import json
import subprocess
import sys

import pytest

from fl_node.simulate import SimulationConfig, run_simulation


def test_three_node_federation_on_digits_learns_and_rejects_the_label_flipper():
    config = SimulationConfig(
        dataset="digits", nodes=3, committee=1, partition="iid", rounds=5, attack="label_flip:0.3", seed=1
    )
    result = run_simulation(config, randomness_secret=SECRET)
    accuracies = [r.test_accuracy for r in result.rounds]
    assert len(result.attackers) == 1
    assert accuracies[-1] > 0.6, accuracies  # chance is 0.1
    assert accuracies[-1] > accuracies[0] or accuracies[0] > 0.6
    rejected = sum(r.attackers_rejected for r in result.rounds if any(u.attacker for u in r.updates))
    attacked = sum(any(u.attacker for u in r.updates) for r in result.rounds)
    assert attacked >= 4 and rejected >= attacked - 1, (rejected, attacked)


def test_committee_rotates_and_never_scores_itself():
    result = run_simulation(
        SimulationConfig(dataset="digits", nodes=4, committee=1, rounds=3, partition="iid")
    )
    for record in result.rounds:
        trainers = {u.trainer for u in record.updates}
        assert trainers.isdisjoint(record.committee)
    committees = [tuple(r.committee) for r in result.rounds]
    assert committees[0] != committees[1] and committees[1] != committees[2]


SECRET = b"the experimenter's own secret"


def test_dp_simulation_stays_within_its_target_epsilon_with_scores_charged():
    config = SimulationConfig(dataset="digits", nodes=3, committee=1, rounds=3, epsilon=2.0, partition="iid")
    result = run_simulation(config)
    assert 0 < result.rounds[0].epsilon_rdp <= result.rounds[-1].epsilon_rdp <= 2.0 + 1e-6
    # Committee members released noisy scores and were charged for them.
    assert result.rounds[-1].score_epsilon_rdp > 0


def test_public_holdouts_are_scored_without_a_charge():
    config = SimulationConfig(
        dataset="digits", nodes=3, committee=1, rounds=2, epsilon=2.0, partition="iid", score_privacy="public"
    )
    result = run_simulation(config)
    assert result.rounds[-1].score_epsilon_rdp == 0


def test_update_mode_keeps_one_mechanism_and_history_per_participant():
    """Record-level accounting of the update mechanism: each node composes only its own releases."""
    from fl_node.simulate import build_participants, prepared_model_and_data

    config = SimulationConfig(
        dataset="digits", nodes=4, committee=1, rounds=4, epsilon=3.0, dp_mode="update", partition="iid"
    )
    result = run_simulation(config)
    # With one shared history the first node's epsilon would count every trainer's release.
    assert 0 < result.rounds[-1].epsilon_rdp <= 3.0 + 1e-6
    splits, _ = prepared_model_and_data("digits", "mlp", seed=0)
    participants = build_participants(config, splits)
    plan = participants[0].plan
    assert plan.train.kind == "update_gaussian"
    assert plan.update_noise_std == pytest.approx(2 * plan.train.noise_multiplier * config.update_clip_norm)


def test_a_secret_makes_a_dp_run_repeatable():
    config = SimulationConfig(dataset="digits", nodes=3, committee=1, rounds=1, epsilon=2.0, partition="iid")
    runs = [run_simulation(config, randomness_secret=secret) for secret in (SECRET, SECRET, None)]
    hashes = [[u.content_hash for u in r.rounds[0].updates] for r in runs]
    assert hashes[0] == hashes[1] and hashes[0] != hashes[2]


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--nodes", "1"], "at least 2 nodes"),
        (["--attack", "poison:0.2"], "unknown attack"),
        (["--strategy", "magic"], "unknown aggregation strategy"),
        (["--partition", "nope"], ""),
    ],
)
def test_cli_refuses_bad_arguments_with_exit_code_2(bad, message, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fl_node",
            "simulate",
            "--dataset",
            "digits",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
            *bad,
        ],
        capture_output=True,
        text=True,
        timeout=600,  # a loaded CI box loads the data slowly: an error must not turn into a timeout
    )
    assert proc.returncode == 2, proc.stderr
    assert "error" in proc.stderr and message in proc.stderr


def test_cli_writes_json_result_and_plot(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fl_node",
            "simulate",
            "--dataset",
            "digits",
            "--nodes",
            "3",
            "--committee",
            "1",
            "--rounds",
            "2",
            "--partition",
            "iid",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert len(result["rounds"]) == 2
    assert json.loads(proc.stdout.strip().splitlines()[-1])["final_accuracy"] == result["final_accuracy"]
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scatternet_federation_trains_its_head_on_precomputed_features():
    config = SimulationConfig(
        dataset="digits", model="scatternet", nodes=3, committee=1, partition="iid", rounds=2,
        epsilon=3.0, batch_size=64, lr=2.0, max_grad_norm=0.1,
    )  # fmt: skip
    result = run_simulation(config, randomness_secret=SECRET)
    assert result.final_accuracy > 0.5, [r.test_accuracy for r in result.rounds]
    assert 0 < result.rounds[-1].epsilon_rdp <= 3.0 + 1e-6

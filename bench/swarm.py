"""Swarm store benchmark: upload/download MB/s against a plain file copy, and peak memory.

Run from the repository root: ``.venv/bin/python bench/swarm.py`` (``--help`` for sizes).

* copy: ``shutil.copyfile`` of the same bytes plus an fsync of the copy, because the store
  fsyncs every chunk (its writes are atomic and durable); the copy without fsync is
  reported too (``copy_nofsync_mb_s``).
* R=1, one node: the uploading process *is* the node: its Python API writes into the
  node's own chunk store in-process. That is how a node stores its own data, and it
  measures the store rather than an HTTP hop to ourselves.
* R=3, four gunicorn nodes on loopback: the client is node A's Python API (A's key and
  chunk store, in this process) pushing every chunk to its 3 closest nodes over signed
  HTTP; the download runs as node D's Python API.
* peak memory: a 1 GB blob uploaded and downloaded (R=3, four nodes) in child processes,
  each reporting its own VmHWM (peak RSS).
* chunk-size sweep: R=1 upload MB/s for several chunk sizes (why 1 MiB).
* CPU cost of a replicated upload, ``upload_r3_core_s_per_gb``: the core-seconds (user +
  system, from /proc) of this process and of the four node processes and their workers
  during the R=3 upload, per GB (10^9 bytes) of user data. Every check is on: peers
  verify signatures, receivers, nonces (in their databases) and rates from the headers,
  re-hash every chunk, and fsync. Goal: <= 6. Unlike the ratio to a copy it does not
  depend on the disk.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.swarm.api import Swarm  # noqa: E402
from backend.swarm.chunker import DEFAULT_CHUNK_SIZE  # noqa: E402
from backend.swarm.network import build_network  # noqa: E402
from backend.swarm.peers import StaticPeerDirectory, parse_peers  # noqa: E402
from backend.swarm.store import ChunkStore  # noqa: E402
from devnet.process import NodeProcess, prepare_nodes, start_all, stop_all  # noqa: E402

MB = 1 << 20


def make_blob(path: Path, size_mb: int) -> None:
    with open(path, "wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(MB))
        f.flush()
        os.fsync(f.fileno())


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def copy_rate(src: Path, dst: Path, size_mb: int, *, fsync: bool) -> float:
    def run() -> None:
        shutil.copyfile(src, dst)
        if fsync:
            fsync_path(dst)

    seconds = timed(run)
    dst.unlink()
    return size_mb / seconds


def node_swarm(
    node: NodeProcess, peers: str, replication: int, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Swarm:
    """A node's Python API in this process (its key, its chunk store, the same peer list)."""
    store = ChunkStore(node.chunk_dir)
    directory = StaticPeerDirectory(parse_peers(peers.split(","))) if peers else StaticPeerDirectory([])
    key = bytes.fromhex(node.private_key.removeprefix("0x"))
    return Swarm(store, build_network(directory, store, key, replication=replication), chunk_size=chunk_size)


def process_tree_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` and all their descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    wanted, frontier = set(pids), list(pids)
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in wanted:
                wanted.add(child)
                frontier.append(child)
    return sum(times.get(pid, 0.0) for pid in wanted)


def self_cpu_s() -> float:
    usage = os.times()
    return usage.user + usage.system


def put_file(swarm: Swarm, path: Path):
    """Upload the file at ``path`` as a stream (Swarm.put takes bytes or a binary stream, never
    a path); returns its reference."""
    with path.open("rb") as stream:
        return swarm.put(stream)


def download(swarm: Swarm, reference, out: Path) -> None:
    with open(out, "wb") as f:
        swarm.get(reference, f, max_bytes=1 << 40)
        f.flush()
        os.fsync(f.fileno())


def vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child_main(args: argparse.Namespace) -> None:
    """One upload or download in a fresh process; prints its peak RSS (and the reference)."""
    swarm = node_swarm(NodeProcess(args.node_dir, private_key=args.key), args.peers, 3)
    if args.child == "upload":
        result = str(put_file(swarm, Path(args.path)))
    else:
        download(swarm, args.reference, Path(args.path))
        result = ""
    print(json.dumps({"reference": result, "vm_hwm_mb": vm_hwm_mb()}))


def run_child(kind: str, node: NodeProcess, peers: str, path: Path, reference: str = "") -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        kind,
        "--node-dir",
        str(node.data_dir),
        "--key",
        node.private_key,
    ]
    command += ["--peers", peers, "--path", str(path), "--reference", reference]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def chunk_sweep(work: Path, blob: Path, size_mb: int) -> dict[str, float]:
    rates = {}
    for chunk_size in (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20):
        node = NodeProcess(work / f"sweep-{chunk_size}")
        swarm = node_swarm(node, "", 1, chunk_size)
        rates[f"{chunk_size >> 10}KiB"] = round(size_mb / timed(lambda s=swarm: put_file(s, blob)), 1)
        swarm.close()
        shutil.rmtree(node.data_dir)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument(
        "--mem-size-mb", type=int, default=1024, help="blob size of the peak-memory run (0: skip)"
    )
    parser.add_argument(
        "--sweep-size-mb", type=int, default=32, help="blob size of the chunk-size sweep (0: skip)"
    )
    parser.add_argument("--workdir", help="where nodes keep their data (default: a temporary directory)")
    parser.add_argument("--child", choices=["upload", "download"], help=argparse.SUPPRESS)
    for hidden in ("--node-dir", "--key", "--peers", "--path", "--reference"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return

    if args.workdir:
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        # Under the repository's var/, on the disk a node's chunk store would use (a tmpfs /tmp
        # would time memory, and refuses the store's O_DIRECT writes); a fresh clone has no var/.
        scratch = Path(__file__).resolve().parents[1] / "var"
        scratch.mkdir(exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="swarm-bench-", dir=scratch))
    size = args.size_mb
    blob = work / "blob.bin"
    make_blob(blob, size)
    result: dict[str, object] = {"size_mb": size, "chunk_size": DEFAULT_CHUNK_SIZE}
    nodes: list[NodeProcess] = []
    try:
        copy = copy_rate(blob, work / "copy.bin", size, fsync=True)
        result["copy_mb_s"] = round(copy, 1)
        result["copy_nofsync_mb_s"] = round(copy_rate(blob, work / "copy.bin", size, fsync=False), 1)

        # R=1: one node, the uploader is the node itself (in-process store).
        solo = NodeProcess(work / "solo")
        swarm = node_swarm(solo, "", 1)
        holder = {}
        up1 = size / timed(lambda: holder.setdefault("ref", put_file(swarm, blob)))
        down1 = size / timed(lambda: download(swarm, holder["ref"], work / "out1.bin"))
        swarm.close()
        print(f"R=1 upload {up1:.0f} MB/s, download {down1:.0f} MB/s, copy {copy:.0f} MB/s", file=sys.stderr)

        # R=3: four gunicorn nodes; A uploads, D downloads.
        nodes = [NodeProcess(work / f"node-{name}") for name in "ABCD"]
        prepare_nodes(nodes, replication=3)
        start_all(nodes, wait_s=180)
        peers = nodes[0].extra_env["DEFL_PEERS"]
        a, d = node_swarm(nodes[0], peers, 3), node_swarm(nodes[3], peers, 3)
        pids = [n.process.pid for n in nodes if n.process is not None]
        cpu_before = self_cpu_s() + process_tree_cpu_s(pids)
        up3 = size / timed(lambda: holder.__setitem__("ref3", put_file(a, blob)))
        cpu_upload = self_cpu_s() + process_tree_cpu_s(pids) - cpu_before
        core_s_per_gb = cpu_upload / (size * MB / 1e9)
        print(f"R=3 upload: {core_s_per_gb:.2f} core-s per GB (goal <= 6)", file=sys.stderr)
        down3 = size / timed(lambda: download(d, holder["ref3"], work / "out3.bin"))
        a.close()
        d.close()
        print(f"R=3 upload {up3:.0f} MB/s, download {down3:.0f} MB/s", file=sys.stderr)
        same = (work / "out3.bin").read_bytes() == blob.read_bytes()
        (work / "out1.bin").unlink()
        (work / "out3.bin").unlink()

        result.update(
            upload_r1_mb_s=round(up1, 1),
            download_r1_mb_s=round(down1, 1),
            upload_r3_mb_s=round(up3, 1),
            download_r3_mb_s=round(down3, 1),
            upload_r1_vs_copy=round(up1 / copy, 3),
            upload_r3_vs_copy=round(up3 / copy, 3),
            download_r1_vs_copy=round(down1 / copy, 3),
            download_r3_vs_copy=round(down3 / copy, 3),
            r3_download_identical=same,
            upload_r3_core_s_per_gb=round(core_s_per_gb, 2),
            upload_r3_core_s_per_gb_goal=6.0,
        )

        if args.mem_size_mb:
            big = work / "big.bin"
            make_blob(big, args.mem_size_mb)
            up = run_child("upload", nodes[0], peers, big)
            big.unlink()
            down = run_child("download", nodes[3], peers, work / "big-out.bin", up["reference"])
            (work / "big-out.bin").unlink()
            result.update(
                peak_mem_upload_mb_1gb=round(up["vm_hwm_mb"], 1),
                peak_mem_download_mb_1gb=round(down["vm_hwm_mb"], 1),
                peak_mem_mb_1gb=round(max(up["vm_hwm_mb"], down["vm_hwm_mb"]), 1),
                mem_blob_mb=args.mem_size_mb,
            )
        stop_all(nodes)
        if args.sweep_size_mb:
            sweep_blob = work / "sweep.bin"
            make_blob(sweep_blob, args.sweep_size_mb)
            result["r1_upload_mb_s_by_chunk_size"] = chunk_sweep(work, sweep_blob, args.sweep_size_mb)
    finally:
        stop_all(nodes)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

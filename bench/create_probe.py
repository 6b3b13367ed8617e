"""Is creating files slow on this host, or is it envvault? Rebuilds the venv's tree (its paths and sizes, each
file's bytes zeros) under a fresh folder with plain Python, several ways, and times each way's opens:
processes or threads, files in path order or grouped by top-level folder, with or without the bytes.
Usage: python3 bench/create_probe.py VENV [ROUNDS] (device: bench/results/gpu_create_probe_*.txt)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

VENV = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
DEST = "/tmp/create_probe"
ZEROS = bytes(8 << 20)


def listing():
    files, dirs = [], []
    for d, ds, fs in os.walk(VENV):
        rel = os.path.relpath(d, VENV)
        dirs.append(rel)
        for f in fs:
            p = os.path.join(d, f)
            if os.path.isfile(p) and not os.path.islink(p):
                files.append((os.path.normpath(os.path.join(rel, f)), os.lstat(p).st_size))
    return sorted(files), sorted(dirs)


def write_one(path: str, size: int, data: bool, stats: list):
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    t1 = time.perf_counter()
    try:
        while data and size > 0:
            size -= os.write(fd, ZEROS[: min(size, len(ZEROS))])
    finally:
        os.close(fd)
    stats.append(t1 - t0)


def chunks(files, how: str, n: int):
    if how == "grouped":  # whole top-level folders, largest first
        groups: dict[str, list] = {}
        for f in files:
            parts = f[0].split(os.sep)
            key = os.sep.join(parts[:4]) if len(parts) > 4 else f[0]
            groups.setdefault(key, []).append(f)
        return sorted(groups.values(), key=lambda g: -sum(s for _, s in g))
    runs, run, size = [], [], 0  # path order, runs of 16 MiB or 16 files, the way the materializer cuts them
    for f in files:
        run.append(f)
        size += f[1] + 4096
        if size >= (16 << 20) or (len(run) >= 16 and size >= (1 << 20)):
            runs.append(run)
            run, size = [], 0
    if run:
        runs.append(run)
    return sorted(runs, key=lambda r: -sum(s for _, s in r))


def variant(files, dirs, how: str, kind: str, n: int, data: bool) -> str:
    shutil.rmtree(DEST, ignore_errors=True)
    subprocess.run(["sync"])
    for d in dirs:
        os.makedirs(os.path.join(DEST, d), exist_ok=True)
    work = chunks(files, how, n)
    t0 = time.perf_counter()
    if kind == "proc":
        r, w = os.pipe()
        os.write(w, b"".join(i.to_bytes(4, "big") for i in range(len(work))))  # < 64 KiB of tasks
        os.close(w)
        outs, pids = [], []
        for _ in range(n):
            pr, pw = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(pr)
                stats: list = []
                while len(got := os.read(r, 4)) == 4:
                    for p, s in work[int.from_bytes(got, "big")]:
                        write_one(os.path.join(DEST, p), s, data, stats)
                os.write(pw, repr(stats).encode())
                os._exit(0)
            os.close(pw)
            outs.append(pr)
            pids.append(pid)
        stats = []
        for pr, pid in zip(outs, pids):
            buf = b""
            while (c := os.read(pr, 1 << 20)):
                buf += c
            stats += eval(buf.decode() or "[]")
            os.waitpid(pid, 0)
    else:
        stats = []
        lock = threading.Lock()
        it = iter(work)

        def loop():
            mine: list = []
            while True:
                with lock:
                    run = next(it, None)
                if run is None:
                    break
                for p, s in run:
                    write_one(os.path.join(DEST, p), s, data, mine)
            with lock:
                stats.extend(mine)

        ts = [threading.Thread(target=loop) for _ in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    wall = time.perf_counter() - t0
    stats.sort()
    slow = sum(1 for s in stats if s > 0.01)
    return (f"{how:8} {kind:6} x{n:2} {'data' if data else 'empty':5}: wall {wall:6.2f} s; opens {len(stats)}, "
            f"sum {sum(stats):7.2f} s, median {stats[len(stats) // 2] * 1e6:7.0f} us, p99 {stats[int(len(stats) * .99)] * 1e6:8.0f} us, "
            f"max {stats[-1] * 1e3:7.1f} ms, over 10 ms: {slow}")


files, dirs = listing()
print(f"{VENV}: {len(files)} files, {sum(s for _, s in files) / 1e9:.2f} GB, {len(dirs)} folders; {os.cpu_count()} cores")
plan = [("path", "proc", 8, True), ("grouped", "proc", 8, True), ("path", "thread", 8, True), ("path", "proc", 1, True),
        ("path", "proc", 8, False), ("path", "proc", 1, False)]
for r in range(ROUNDS):
    for how, kind, n, data in plan:
        print(f"round {r + 1} " + variant(files, dirs, how, kind, n, data), flush=True)
shutil.rmtree(DEST, ignore_errors=True)

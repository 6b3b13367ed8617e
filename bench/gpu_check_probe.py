"""Where the quick ``status``'s freshness check goes on the device's own venv (issue 11): run by the host's
``python3`` with the carried wheels on PYTHONPATH (as the whole run's status row), after a snap and a full
status. Prints the process's RSS when the check forks, the parent's seconds in ``os.fork``, and
``verdict.unchanged_since`` in process under several child counts (9 rounds, settings in turn), beside the
serial check (one process). Usage: python3 bench/gpu_check_probe.py VAULT VENV
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from envvault.vault import forked
from envvault.snap.verdict import unchanged_since
from envvault.vault.location import default_vault_path


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def main() -> None:
    root, venv = default_vault_path(sys.argv[1]), sys.argv[2]
    real_fork, spent = os.fork, []

    def timed_fork():
        t = time.perf_counter()
        pid = real_fork()
        if pid:
            spent.append(time.perf_counter() - t)
        return pid

    os.fork = timed_fork
    real_check = forked.check_all
    seen = {}

    def check_all(check, items, weights):
        seen["rss"] = rss_mb()
        seen["files"] = sum(weights)
        t = time.perf_counter()
        out = real_check(check, items, weights)
        seen["check"] = time.perf_counter() - t
        return out

    import envvault.snap.fresh as fresh
    fresh.check_all = check_all
    assert unchanged_since(root, venv) is not None
    print(f"files {seen['files']}, RSS at the check {seen['rss']:.1f} MB, python {sys.version.split()[0]}")
    import envvault.snap.fresh as fresh_mod
    parts = [int(p) for p in os.environ.get("PART_FILES", "3000").split(",")]
    settings = [(1, 3000, parts[0])] + [(n, 3000, p) for n in (8, 16) for p in parts]
    walls = {s: [] for s in settings}
    checks = {s: [] for s in settings}
    forks = {s: [] for s in settings}
    for r in range(9):
        for s in settings[r % len(settings):] + settings[:r % len(settings)]:
            forked._MAX_CHILDREN, forked._WEIGHT_A_CHILD, fresh_mod._PART_FILES = s
            spent.clear()
            t = time.perf_counter()
            assert unchanged_since(root, venv) is not None
            walls[s].append(time.perf_counter() - t)
            checks[s].append(seen["check"])
            forks[s].append((len(spent), sum(spent)))
    for s in settings:
        n = statistics.median(f[0] for f in forks[s])
        fs = statistics.median(f[1] for f in forks[s])
        print(f"at most {s[0]:2d} processes, {s[1]} files each at least, parts of {s[2]}: unchanged_since "
              f"{statistics.median(walls[s]) * 1000:.1f} ms (check {statistics.median(checks[s]) * 1000:.1f} ms; "
              f"{n:.0f} forks, {fs * 1000:.1f} ms in os.fork, {fs / max(n, 1) * 1000:.2f} ms each)")
    os.fork = real_fork
    for p in parts:
        fresh_mod._PART_FILES = p
        print(f"parts of {p} files:")
        timeline(root, venv)


def timeline(root, venv) -> None:
    """One check's timeline in the parent (16 processes, the defaults): forks done, its own slice done, each
    child's answer read, children reaped; milliseconds from the start of ``map_all``."""
    marks = []
    t0 = [0.0]
    real_map, real_fork_one, real_read, real_end = forked.map_all, forked._fork_one, forked._read_to_end, forked._end

    def map_all(fn, items, weights):
        t0[0] = time.perf_counter()
        marks.clear()
        return real_map(fn, items, weights)

    def fork_one(*a):
        ok = real_fork_one(*a)
        marks.append(("forked", time.perf_counter()))
        return ok

    def read(fd):
        if not any(m[0] == "own slice done" for m in marks):
            marks.append(("own slice done", time.perf_counter()))
        got = real_read(fd)
        marks.append(("read", time.perf_counter()))
        return got

    def end(kids, kill):
        real_end(kids, kill)
        marks.append(("reaped", time.perf_counter()))

    forked.map_all, forked._fork_one, forked._read_to_end, forked._end = map_all, fork_one, read, end
    import envvault.snap.fresh as fresh
    saved = fresh.check_all
    fresh.check_all = forked.check_all
    try:
        forked._MAX_CHILDREN, forked._WEIGHT_A_CHILD = 16, 3000
        for _ in range(3):
            assert unchanged_since(root, venv) is not None
            print("timeline (ms): " + ", ".join(f"{name} {(t - t0[0]) * 1000:.1f}" for name, t in marks))
    finally:
        forked.map_all, forked._fork_one, forked._read_to_end, forked._end = real_map, real_fork_one, real_read, real_end
        fresh.check_all = saved


if __name__ == "__main__":
    main()

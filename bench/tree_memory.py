"""Run a command and sample its whole process tree's memory every 20 ms (bench only: a first snap's forked
group processes are not in the parent's own peak RSS). Usage: python3 bench/tree_memory.py CMD [ARGS...]; on
stderr at the end: "tree peak PSS: N MB, largest process peak RSS: M MB, processes seen: K". Its exit code is
the command's."""

import os
import subprocess
import sys
import time


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return out


def _tree(pid: int) -> list[int]:
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(_children(p))
    return seen


def _kib(pid: int, path: str, key: str) -> int:
    try:
        with open(f"/proc/{pid}/{path}") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def main() -> int:
    proc = subprocess.Popen(sys.argv[1:])
    peak_pss = peak_rss = 0
    seen: set[int] = set()
    while proc.poll() is None:
        pids = _tree(proc.pid)
        seen.update(pids)
        peak_pss = max(peak_pss, sum(_kib(p, "smaps_rollup", "Pss:") for p in pids))
        peak_rss = max([peak_rss] + [_kib(p, "status", "VmHWM:") for p in pids])
        time.sleep(0.02)
    print(f"tree peak PSS: {peak_pss // 1024} MB, largest process peak RSS: {peak_rss // 1024} MB, "
          f"processes seen: {len(seen)}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

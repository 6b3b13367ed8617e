"""Where do a command's threads wait? Runs COMMAND (through the shell) and, every 5 ms until it ends, reads each
thread of its process tree from /proc: its state (R running, D in the kernel uninterruptibly, S asleep) and
the kernel function it waits in (wchan; with root, the top frames of /proc/TID/stack), and each thread's
last seen CPU seconds (user, system: /proc/TID/stat; on a CPU and waiting for one: /proc/TID/schedstat).
Prints the command's wall time, the threads' seconds summed, and the share of samples per state and per waiting
place, for comparing two tools doing the same work (device: bench/results/gpu_wchan_*.txt). Usage: python3 bench/wchan_sample.py LABEL COMMAND"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

LABEL, COMMAND = sys.argv[1], sys.argv[2]


def tree(root: int) -> list[int]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids[ppid].append(int(name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


TICK = os.sysconf("SC_CLK_TCK")
seconds: dict[str, tuple[float, float, float, float]] = {}  # tid: user, system, on a CPU, waiting for one
states: collections.Counter = collections.Counter()
places: collections.Counter = collections.Counter()
VMSTAT = ("pgscan_direct", "pgsteal_direct", "allocstall_normal", "allocstall_movable", "pgscan_kswapd",
          "pgsteal_kswapd", "pgfault", "pgmajfault", "thp_fault_alloc", "nr_dirty", "nr_writeback", "pgactivate",
          "workingset_refault_file", "compact_stall", "pgalloc_normal", "pgfree")


def vmstat() -> dict[str, int]:
    got = dict(line.split() for line in read("/proc/vmstat").splitlines() if line.count(" ") == 1)
    return {k: int(got.get(k, 0)) for k in VMSTAT}


def memory() -> str:
    free = {ln.split(":")[0]: ln.split()[1] for ln in read("/proc/meminfo").splitlines()}
    cg = read("/proc/self/cgroup").strip().rsplit(":", 1)[-1]
    cap = read(f"/sys/fs/cgroup{cg}/memory.max").strip() or "?"
    now = read(f"/sys/fs/cgroup{cg}/memory.current").strip() or "?"
    return (f"MemFree {int(free.get('MemFree', 0)) >> 20} GiB, Cached {int(free.get('Cached', 0)) >> 20} GiB, "
            f"Dirty {int(free.get('Dirty', 0)) >> 10} MiB; cgroup {cg} memory.max {cap}, memory.current {now}")


before, mem_before = vmstat(), memory()
t0 = time.perf_counter()
proc = subprocess.Popen(COMMAND, shell=True, stdout=subprocess.DEVNULL)
samples = 0
while proc.poll() is None:
    for pid in tree(proc.pid):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            stat = read(f"/proc/{pid}/task/{tid}/stat")
            if not stat:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            state = fields[0]
            sched = read(f"/proc/{pid}/task/{tid}/schedstat").split()
            if len(sched) >= 2:
                seconds[f"{pid}/{tid}"] = (int(fields[11]) / TICK, int(fields[12]) / TICK, int(sched[0]) / 1e9,
                                           int(sched[1]) / 1e9)
            states[state] += 1
            if state in "DSR":
                frames = [ln.split()[-1].split("+")[0] for ln in read(f"/proc/{pid}/task/{tid}/stack").splitlines()]
                frames = [f for f in frames if not f.startswith(("__schedule", "schedule", "io_schedule"))][:4]
                where = " < ".join(frames) or (read(f"/proc/{pid}/task/{tid}/wchan") if state != "R" else "")
                if not where:
                    continue  # a running thread's stack cannot be read
                places[f"{state} {where}"] += 1
    samples += 1
    time.sleep(0.005)
wall = time.perf_counter() - t0
total = sum(states.values()) or 1
print(f"{LABEL}: {wall:.2f} s, {samples} samples, rc {proc.returncode}; thread states: "
      + ", ".join(f"{s} {n / total:.0%}" for s, n in states.most_common()))
sums = [sum(v[k] for v in seconds.values()) for k in range(4)]
print(f"  threads seen {len(seconds)}; summed: user {sums[0]:.2f} s, system {sums[1]:.2f} s, on a CPU {sums[2]:.2f} s, "
      f"runnable waiting for a CPU {sums[3]:.2f} s (last samples: a thread's final moments are not counted)")
after = vmstat()
print(f"  before: {mem_before}\n  vmstat deltas: "
      + ", ".join(f"{k} {after[k] - before[k]}" for k in VMSTAT if after[k] != before[k]))
for where, n in places.most_common(14):
    print(f"  {n / total:6.1%} {where}")

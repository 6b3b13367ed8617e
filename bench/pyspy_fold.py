"""Summarise a py-spy raw profile (``py-spy record -f raw --threads``; with ``--gil``, only the thread holding
the GIL is sampled): samples per thread kind (the materializer's stage threads, the main thread and any other), the
main thread's time per step of the command (the frames below FRAME, default ``restore_into``), and the leaf
functions of each kind. Usage: python3 bench/pyspy_fold.py RAW RATE [FRAME] (device: bench/results/gpu_pyspy_*.txt)."""

from __future__ import annotations

import collections
import re
import sys

RAW, RATE = sys.argv[1], float(sys.argv[2])
FRAME = sys.argv[3] if len(sys.argv) > 3 else "restore_into"
kinds: collections.Counter = collections.Counter()
leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
steps: collections.Counter = collections.Counter()
for line in open(RAW):
    stack, _, count = line.rstrip("\n").rpartition(" ")
    n = int(count)
    frames = stack.split(";")
    name = frames[0]  # "thread (TID): NAME" where py-spy knows the name
    kind = "stage" if "envvault-stage" in name or "stage.<locals>.run" in stack else "main"
    kinds[kind] += n
    leaves[kind][re.sub(r" \(.*?:\d+\)", "", frames[-1]) + " <- " + re.sub(r" \(.*?:\d+\)", "", frames[-2] if len(frames) > 2 else "")] += n
    if kind == "main":
        at = next((i for i, f in enumerate(frames) if f.startswith(FRAME + " ")), None)
        steps[frames[at + 1] if at is not None and at + 1 < len(frames) else "(outside " + FRAME + ")"] += n
total = sum(kinds.values())
print(f"{RAW}: {total} samples at {RATE:g}/s; " + ", ".join(f"{k} {v / RATE:.2f} s" for k, v in kinds.most_common()))
print(f"main thread, by step under {FRAME}:")
for s, n in steps.most_common(15):
    print(f"  {n / RATE:6.2f} s  {s}")
for k, c in leaves.items():
    print(f"{k} threads, leaf <- caller:")
    for s, n in c.most_common(12):
        print(f"  {n / RATE:6.2f} s  {s}")

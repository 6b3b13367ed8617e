"""Yes/no checks over many items, split across forked child processes: an unchanged scan ``lstat``s every
stored file of the environment (49,000 on a 7 GB venv), one system call and a little Python each, which one
interpreter does at one core's pace and threads cannot share out (the GIL). Children forked from this
process each check a slice and send one byte an item back through a pipe.

Forking is only for what it is safe and worth for: where ``vault/children.py`` allows it (Linux, a process
with no other thread), two cores or more and enough work (``FORK_MIN_WEIGHT``); children are made and reaped
there (``fork_child``, ``reap``). Whatever a child does not answer (it failed, was killed, sent too little) is
checked here, in this process: the answers never depend on the children.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from envvault.vault.children import fork_child, may_fork, read_exact, reap

__all__ = ["check_all", "FORK_MIN_WEIGHT"]

FORK_MIN_WEIGHT = 8000  # the items' weights (files to lstat) below which one process checks them all
_WEIGHT_A_CHILD = 4000  # at least this much work a child, else fewer children
_MAX_CHILDREN = 8


def check_all(check: Callable[[object], bool], items: Sequence, weights: Sequence[int]) -> list[bool]:
    """``[check(item) for item in items]``, in forked children when that pays (``workers``); ``check``
    must only read (it runs in a copy of this process) and return a bool. ``weights``: each item's cost."""
    total = sum(weights)
    workers = _children(total)
    if workers < 2:
        return [bool(check(it)) for it in items]
    slices = _slices(weights, total, workers)
    answers: list[bool | None] = [None] * len(items)
    kids: list[tuple[int, int, list]] = []  # (pid, read end, the items it checks)
    finished = False
    try:
        for part in slices[1:]:
            if not _fork_one(check, items, part, kids):  # no fork (out of processes, memory): checked below
                break
        for i in slices[0]:  # this process takes the first slice meanwhile
            answers[i] = bool(check(items[i]))
        for pid, fd, part in kids:
            got = read_exact(fd, len(part))
            for i, b in zip(part, got):
                answers[i] = b == 1
        finished = True
    finally:
        for pid, fd, _ in kids:
            reap(pid, (fd,), kill=not finished)
    # a child that failed or sent less, a slice no child took: here
    return [a if a is not None else bool(check(items[i])) for i, a in enumerate(answers)]


def _children(total: int) -> int:
    if total < FORK_MIN_WEIGHT or not may_fork():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(_MAX_CHILDREN, cores, total // _WEIGHT_A_CHILD))


def _slices(weights: Sequence[int], total: int, workers: int) -> list[list[int]]:
    """The items shared out to ``workers`` slices of about equal weight: heaviest first, each to the
    lightest slice so far. The first slice (this process's) gets the lightest share."""
    loads = [0] * workers
    out: list[list[int]] = [[] for _ in range(workers)]
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        k = loads.index(min(loads))
        out[k].append(i)
        loads[k] += weights[i]
    order = sorted(range(workers), key=lambda k: loads[k])
    return [out[k] for k in order if out[k]]


def _fork_one(check: Callable, items: Sequence, part: list, kids: list) -> bool:
    """Fork a child that answers ``part`` with one byte an item; it goes on ``kids`` (pid, read end, part)
    before any signal can interrupt this process. False when no child could be made."""
    try:
        r, w = os.pipe()
    except OSError:
        return False

    def answer() -> None:
        view = memoryview(bytes(1 if check(items[i]) else 0 for i in part))
        while view:
            view = view[os.write(w, view):]

    if not fork_child(answer, (r,), lambda pid: kids.append((pid, r, part))):
        os.close(r)
        os.close(w)
        return False
    os.close(w)
    return True

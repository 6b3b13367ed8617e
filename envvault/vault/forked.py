"""Work over many items split across forked child processes: an unchanged scan ``lstat``s every stored file
of the environment (69,000 on a 7 GB venv), and a check scan of distributions the stat cache has no group for
(the verification after ``restore --into``) builds every manifest from the files' stats, one system call and
a little Python a file, which one interpreter does at one core's pace and threads cannot share out (the GIL).

The items are shared out as they are taken, not in slices fixed up front: before any fork, this process
writes the numbers of the tasks (an item each, heaviest first; runs of items when there are more than
``_MAX_TASKS``) into a pipe and closes its write end; every child, and this process once it has forked them
all, reads the next number (four bytes: a read of a pipe is whole) and answers that task, until the pipe is
empty. A child forked early, or on a quicker core, takes more; this process takes what is left when its forks
are done. (With slices fixed up front, the last children, forked 10 ms after the first on the GPU host, sent
their answers 2-15 ms after this process had answered its own slice: bench/results/gpu_check_probe_8ab6968.txt,
gpu_check_ab_14fb1e6.txt.) Each child sends its answers back through a pipe of its
own, each tagged with its item's position (``map_all``: bytes of any length; ``check_all``: one byte a
yes/no check).

Forking is only for what it is safe and worth for: Linux, a process with no other thread (a child of a
threaded process may inherit a lock another thread held), two cores or more and enough work
(``FORK_MIN_WEIGHT``). A child drops the parent's signal handlers and its garbage collector, answers, and
leaves with ``os._exit``; with ``ENVVAULT_STAGES=1`` its stages' seconds follow its answers and are added to
this process's as "forked children: <stage>". Whatever a child does not answer (it failed, was killed, sent
too little, took a task and never answered it) is answered here, in this process, by the same function: the
answers never depend on the children. A child whose function raises takes every task left (so no process
starts another), sends what it answered and the item it failed on, which this process computes first (the
error raised here at once, not after the rest is redone). A child whose parent is gone (killed) stops before
its next task.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Callable, Iterator, Sequence

from envvault import crashpoints, terminate
from envvault.vault import timing

__all__ = ["check_all", "map_all", "workers_for", "can_fork", "FORK_MIN_WEIGHT"]

FORK_MIN_WEIGHT = 8000  # the items' weights (files to lstat) below which one process checks them all
# At least this much work a child (else fewer children), at most this many processes: on the GPU host
# (16 cores, 49,405 files) the quick status's check took 58 ms with 16 and 3,000, 68 ms with 8 and 4,000
# (bench/gpu_quick_profile.py; 24 processes gained nothing more).
_WEIGHT_A_CHILD = 3000
_MAX_CHILDREN = 16


def check_all(check: Callable[[object], bool], items: Sequence, weights: Sequence[int]) -> list[bool]:
    """``[check(item) for item in items]``, in forked children when that pays (``workers``); ``check``
    must only read (it runs in a copy of this process) and return a bool. ``weights``: each item's cost."""
    return [b == b"\x01" for b in map_all(lambda it: b"\x01" if check(it) else b"\x00", items, weights)]


def map_all(fn: Callable[[object], bytes], items: Sequence, weights: Sequence[int],
            processes: int | None = None, here: bool = True, pids: list | None = None,
            done: Callable[[int], None] | None = None, bound: bool = False) -> list[bytes]:
    """``[fn(item) for item in items]``, in forked children when that pays; ``fn`` must only read (what it
    changes stays in the child) and return bytes, its whole answer. Whatever a child does not answer is
    computed here by the same ``fn``. ``processes``: how many processes do the work (this one among them),
    in place of ``workers_for``'s rule and its ``FORK_MIN_WEIGHT``, where forking is safe at all
    (``can_fork``). ``here=False``: this process only waits and forks ``processes`` children (work whose
    memory this process should not keep). ``pids``: given a list,
    each child's process id is added to it (every one has ended when this returns or raises). ``done(i)``:
    called in this process as item ``i`` is answered, by any process (a child's are passed on through a pipe
    of their own, read between this process's items: a progress bar; best effort, not every item need come).
    ``bound``: each child has the kernel SIGKILL it as soon as this process ends (Linux's ``PR_SET_PDEATHSIG``;
    children that write, which must not work on for a process killed with SIGKILL; it costs each child the
    import of ``ctypes``); without it a child whose parent is gone stops before its next task."""
    total = sum(weights)
    workers = workers_for(total) if processes is None else (processes if can_fork() else 1)
    if workers < 2:
        return [_told(done, i, fn(it)) for i, it in enumerate(items)]
    tasks = _tasks(weights)
    queue = _queue(len(tasks))
    if queue is None:  # no pipe could be made or filled: one process answers all
        return [_told(done, i, fn(it)) for i, it in enumerate(items)]
    answers: list[bytes | None] = [None] * len(items)
    kids: list[tuple[int, int]] = []  # (pid, read end of its answers)
    told = _Told(done) if done is not None else None
    failed: list[int] = []  # items a child raised on (``_FAILED`` frames)
    finished = False
    try:
        for _ in range(workers - 1 if here else workers):
            # no fork (out of processes, memory): taken below
            if not _fork_one(fn, items, tasks, queue, kids, told.write_end if told else None, bound):
                break
            if pids is not None:
                pids.append(kids[-1][0])
        if told:
            told.forked()
        for n in _taken(queue) if here else ():  # this process takes what the children have not
            for i in tasks[n]:
                answers[i] = fn(items[i])
                if told:
                    told.here(i)
        for sent in _gather([fd for _pid, fd in kids], told):
            for i, got in _frames(sent):
                if i == _STAGES:
                    if timing.ON:
                        timing.merge(got, "forked children: ")
                elif i == _FAILED:
                    at = int.from_bytes(got[:4], "big") if len(got) == 4 else len(answers)
                    if at < len(answers):
                        failed.append(at)
                elif i < len(answers):
                    answers[i] = got
        finished = True
    finally:
        os.close(queue)
        try:
            if told:
                told.close()  # no ``done`` while ending
        finally:
            if kids:
                _end(kids, kill=not finished)
    # a child that failed or sent less, a task taken and never answered: here, an item a child failed on first
    # (an error it raised comes back here at once, before the rest is redone)
    for i in failed:
        if answers[i] is None:
            answers[i] = fn(items[i])
    return [a if a is not None else fn(items[i]) for i, a in enumerate(answers)]


def _told(done: Callable[[int], None] | None, i: int, answer: bytes) -> bytes:
    if done is not None:
        done(i)
    return answer


class _Told:
    """``map_all``'s ``done``: the positions the children answer come through a pipe (four bytes each, written
    without waiting: a full pipe drops them), read here without waiting between this process's own items."""

    def __init__(self, done: Callable[[int], None]) -> None:
        self.done = done
        self.read_end: int | None = None
        self.write_end: int | None = None
        try:
            self.read_end, self.write_end = os.pipe()
            os.set_blocking(self.read_end, False)
            os.set_blocking(self.write_end, False)
        except OSError:
            self.close()

    def forked(self) -> None:
        """Every child is forked: this process keeps no write end (the children's ends close as they leave)."""
        if self.write_end is not None:
            os.close(self.write_end)
            self.write_end = None

    def here(self, i: int) -> None:
        self.done(i)
        self.drain()

    def drain(self) -> bool:
        """Pass on every position waiting in the pipe; False once it is at its end (every child has left)."""
        while self.read_end is not None:
            try:
                got = os.read(self.read_end, 4096)
            except BlockingIOError:
                return True
            except OSError:
                got = b""
            if not got:
                return False
            for at in range(0, len(got) - 3, 4):
                self.done(int.from_bytes(got[at:at + 4], "big"))
        return False

    def close(self) -> None:
        """Close both ends; what is still waiting is not passed on (the caller's own end says it all)."""
        self.forked()
        if self.read_end is not None:
            os.close(self.read_end)
            self.read_end = None


def workers_for(total: int) -> int:
    """How many processes ``map_all`` would share work of weight ``total`` out to (1: no fork)."""
    if total < FORK_MIN_WEIGHT or not can_fork():
        return 1
    from envvault.vault.threads import usable_cores

    return max(1, min(_MAX_CHILDREN, usable_cores(), total // _WEIGHT_A_CHILD))


def can_fork() -> bool:
    """Forking is safe here: Linux, and no other thread in this process; and no crash test is armed (it kills,
    terminates or stops the process itself at a named point, which a child passing the point would do to
    itself alone: helper 36 saw a snap's forked group stop at ``pack_frame`` and its parent wait for ever)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork") or crashpoints.armed():
        return False
    return threading.active_count() == 1 and _one_thread()


def _one_thread() -> bool:
    """This process has one thread, native ones included (zstd's, BLAKE3's pool: ``threading`` does not
    count them, and a child of a threaded process may inherit a lock another thread held)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


_MAX_TASKS = 1024  # task numbers in the pipe, at most: 4 KiB, what any pipe holds (one page, PIPE_BUF)
_STAGES = 0xFFFFFFFF  # the position a child's stages frame is tagged with (ENVVAULT_STAGES)
_FAILED = 0xFFFFFFFE  # the position of the frame naming the item a child raised on


def _tasks(weights: Sequence[int]) -> list[list[int]]:
    """The items (by position) in tasks, heaviest first: an item each, or, with more items than
    ``_MAX_TASKS``, runs of the items in that order. Every item is in one task."""
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    size = max(1, -(-len(order) // _MAX_TASKS))
    return [order[a:a + size] for a in range(0, len(order), size)]


def _queue(count: int) -> int | None:
    """The read end of a pipe holding the task numbers 0 to ``count - 1`` (four bytes each, big-endian) and
    no write end anywhere: a read takes the next number, and gives nothing once none is left. None when no
    pipe could be made or filled."""
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        data = b"".join(n.to_bytes(4, "big") for n in range(count))
        os.set_blocking(w, False)  # at most 4 KiB, written whole into an empty pipe; never a wait
        done = os.write(w, data) == len(data)
    except OSError:
        done = False
    finally:
        os.close(w)
    if not done:
        os.close(r)
        return None
    return r


def _taken(queue: int) -> Iterator[int]:
    """The task numbers this process takes from ``queue``, one read at a time, until it is empty."""
    while True:
        got = os.read(queue, 4)
        if len(got) != 4:
            return
        yield int.from_bytes(got, "big")


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _fork_one(fn: Callable, items: Sequence, tasks: list[list[int]], queue: int, kids: list,
              told: int | None = None, bound: bool = False) -> bool:
    """Fork a child that answers the tasks it takes from ``queue``; it goes on ``kids`` (pid, read end)
    before any signal can interrupt this process, so an interrupted parent always reaps it. False when no
    child could be made. ``told``: a pipe's write end (non-blocking) the child writes each answered
    item's position to (``_Told``)."""
    try:
        r, w = os.pipe()
    except OSError:
        return False
    # Signals wait until the child is on ``kids`` (parent) or has dropped the parent's handlers (child): a
    # Ctrl-C landing in between must not run the parent's cleanup in the child.
    parent = os.getpid()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(r)
        os.close(w)
        return False
    if pid == 0:  # the child: answer, then leave at once (no atexit handlers, no buffers flushed twice)
        code = 1
        try:
            gc.disable()  # no finalizer of an object inherited from the parent runs here
            for sig in _SIGNALS:  # a signal ends the child (the parent answers its tasks); one ignored, or a
                # hang-up the parent carries on past, stays so
                if signal.getsignal(sig) not in (signal.SIG_IGN, terminate.hung_up):
                    signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            if bound:
                _end_with_parent()
            os.close(r)
            if timing.ON:
                timing.clear()  # the stages inherited are the parent's: this child reports only its own
            # Every answer first, then one write: a child that waits on a full pipe while the parent reads
            # another's has already done its work. Each answer: its item's position, its length, its bytes.
            out = bytearray()
            i = -1
            try:
                for n in _taken(queue):
                    if os.getppid() != parent:  # the parent is gone (killed): nothing more to do for it
                        os._exit(1)
                    for i in tasks[n]:
                        got = fn(items[i])
                        out += i.to_bytes(4, "big") + len(got).to_bytes(4, "big")
                        out += got
                        if told is not None:
                            try:
                                os.write(told, i.to_bytes(4, "big"))  # four bytes: whole or not at all
                            except OSError:
                                pass
                i = -1
            except Exception:  # noqa: BLE001 - the parent computes item i first and raises what it raises
                while os.read(queue, 4096):  # every task left taken: no process starts another
                    pass
                if i >= 0:
                    out += _FAILED.to_bytes(4, "big") + (4).to_bytes(4, "big") + i.to_bytes(4, "big")
            if timing.ON:  # one more frame after the answers: this child's stages (ENVVAULT_STAGES)
                got = timing.encoded()
                out += _STAGES.to_bytes(4, "big") + len(got).to_bytes(4, "big")
                out += got
            view = memoryview(out)
            while view:
                view = view[os.write(w, view):]
            code = 0
        except BaseException:  # noqa: BLE001 - any failure: the parent answers what this child took
            pass
        finally:
            os._exit(code)
    kids.append((pid, r))
    os.close(w)  # before Ctrl-C can land: the parent keeps no write end of a child's pipe
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return True


def _end_with_parent() -> None:
    """In a child: have the kernel SIGKILL it when the process that forked it ends (``PR_SET_PDEATHSIG``);
    where that cannot be asked (no ``ctypes``), the check before each task stands alone."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError, ImportError):
        pass


def _gather(fds: Sequence[int], told: "_Told | None") -> list[bytes]:
    """Everything each of ``fds`` gives until its end, read as it comes (a child blocked on a full pipe is
    read at once, whatever the others do); the children's ``told`` positions passed on meanwhile."""
    import select  # only once children were forked

    got: dict[int, list[bytes]] = {fd: [] for fd in fds}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    if told is not None and told.read_end is not None:
        poller.register(told.read_end, select.POLLIN)
    left = set(fds)
    while left:
        for fd, _event in poller.poll():
            if fd not in got:  # ``told``'s pipe: at its end once every child has left
                if not told.drain():
                    poller.unregister(fd)
                continue
            chunk = os.read(fd, 1 << 20)
            if chunk:
                got[fd].append(chunk)
            else:
                poller.unregister(fd)
                left.discard(fd)
    if told is not None:
        told.drain()  # a child tells each position before it sends its answers: every one is there now
    return [b"".join(got[fd]) for fd in fds]


def _frames(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The answers a child sent, each ``(position, bytes)`` (a 4-byte big-endian position and length, then that
    many bytes), up to the first one cut short."""
    at = 0
    while at + 8 <= len(data):
        i, n = int.from_bytes(data[at:at + 4], "big"), int.from_bytes(data[at + 4:at + 8], "big")
        if at + 8 + n > len(data):
            return
        yield i, data[at + 8:at + 8 + n]
        at += 8 + n


def _end(kids: list, kill: bool) -> None:
    """Close the pipes and wait for the children (each has answered, or failed: it is ending). ``kill`` (this
    process was interrupted while children ran): every child is sent SIGKILL first. Those calls and the
    pipes' closing run with Ctrl-C held back (a few non-blocking calls), so that a second Ctrl-C leaves no child
    running and no pipe open (at worst some children unreaped until this process ends). The waits stay
    interruptible: a child stuck in a read of a hung network file system never makes this process deaf to
    Ctrl-C."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        for pid, fd in kids:
            if kill:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.close(fd)
            except OSError:
                pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    for pid, _ in kids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

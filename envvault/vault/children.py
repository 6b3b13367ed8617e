"""Forked child processes, for work that is one system call and a little Python an item, which threads cannot
share out (the GIL): when forking is safe, how a child is made and reaped (``fork_child``, ``reap``), and the
children that read a first snap's small files for its reader threads (``ReadChildren``). The unchanged
scan's stat checks (``snap/forked.py``) fork through the same ``fork_child``.

Forking is only for a process with no other thread (a child of a threaded process may inherit a lock another
thread held), on Linux. A child drops the parent's signal handlers and its garbage collector, does its work,
and leaves with ``os._exit``. Whatever a child does not answer (it failed, was killed, sent too little) is
done in the parent: no answer depends on the children.
"""

from __future__ import annotations

import gc
import os
import pickle
import queue
import signal
import struct
import sys
import threading
from typing import Callable, Sequence

__all__ = ["may_fork", "fork_child", "reap", "read_exact", "ReadChildren"]

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def may_fork() -> bool:
    """Linux, ``os.fork``, and this process has one thread, native ones included (zstd's, BLAKE3's pool:
    ``threading`` does not count them)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def fork_child(work: Callable[[], None], close_in_child: Sequence[int], recorded: Callable[[int], None]) -> bool:
    """Fork a child that runs ``work()`` and exits (0 when it returned, 1 when it raised). ``close_in_child``:
    the parent's ends of the child's pipes (closed in the child first). ``recorded(pid)`` runs in the parent
    before any signal can interrupt it, so an interrupted parent always knows the child and reaps it. False
    when no child could be made."""
    # Signals wait until the child is recorded (parent) or has dropped the parent's handlers (child): a
    # Ctrl-C landing in between must not run the parent's cleanup in the child.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return False
    if pid == 0:  # the child: work, then leave at once (no atexit handlers, no buffers flushed twice)
        code = 1
        try:
            gc.disable()  # no finalizer of an object inherited from the parent runs here
            for sig in SIGNALS:
                signal.signal(sig, signal.SIG_DFL)  # a signal ends the child; the parent does its part
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            for fd in close_in_child:
                os.close(fd)
            work()
            code = 0
        except BaseException:  # noqa: BLE001 - any failure: the parent does this part itself
            pass
        finally:
            os._exit(code)
    try:
        recorded(pid)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return True


def reap(pid: int, fds: Sequence[int], kill: bool) -> None:
    """Close the parent's ends of a child's pipes and wait for it (it has answered, or failed: it is
    ending); ``kill`` (the parent was interrupted or gave up on it) ends it first."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        if kill:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass


def read_exact(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``fd``, until its end (fewer: the writer ended first)."""
    parts, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


_HEADER = struct.Struct("<Q")
_PIPE_BYTES = 1 << 20  # F_SETPIPE_SZ: a batch's answer in a few writes, not one a 64 KiB
_F_SETPIPE_SZ = 1031


class ReadChildren:
    """Forked children that read whole small files for the reader threads of a first snap (``Ingester``).

    A reader hands a child the paths of a batch of small files and waits (the GIL free) while the child
    opens, reads and hashes them with the parent's own read function (``read_one``, inherited by the fork:
    the same rules, one home); the answers come back as one pickle, between two copies of this same
    program. The reader then stores their objects in order as if it had read them: the vault's bytes do not
    depend on the children. A file a child could not read is read again by the reader (its error, if any, is
    raised there); a child that dies or answers short is dropped and its batch read by the reader.
    ``start`` forks only where ``may_fork`` allows; the children end when their request pipe closes
    (``close``, or this process's death)."""

    def __init__(self, read_one: Callable[[str, int], object]) -> None:
        self._read_one = read_one
        self._free: queue.SimpleQueue = queue.SimpleQueue()  # (pid, request fd, answer fd) ready for a batch
        self._kids: list[tuple[int, int, int]] = []  # every child started, for ``close``
        self.dropped = 0  # children given up on (died, answered short)

    @classmethod
    def start(cls, count: int, read_one: Callable[[str, int], object]) -> "ReadChildren | None":
        """``count`` children, or fewer (out of processes); None when forking is not safe here or none
        could be made."""
        if count < 1 or not may_fork():
            return None
        kids = cls(read_one)
        for _ in range(count):
            if not kids._fork_one():
                break
        if not kids._kids:
            return None
        return kids

    @property
    def pids(self) -> list[int]:
        return [pid for pid, _, _ in self._kids]

    @property
    def count(self) -> int:
        return len(self._kids)

    def _fork_one(self) -> bool:
        try:
            req_r, req_w = os.pipe()
        except OSError:
            return False
        try:
            ans_r, ans_w = os.pipe()
        except OSError:
            os.close(req_r)
            os.close(req_w)
            return False
        for fd in (req_w, ans_w):
            try:
                import fcntl

                fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)
            except (OSError, ImportError):
                pass  # a smaller pipe: more writes, same answers
        # The child closes the parent's ends of its own pipes and of every child made before it (else an
        # earlier child would not see its request pipe close while a later one lives).
        theirs = [fd for _, w, r in self._kids for fd in (w, r)] + [req_w, ans_r]
        made: list[int] = []
        if not fork_child(lambda: self._serve(req_r, ans_w), theirs, made.append):
            for fd in (req_r, req_w, ans_r, ans_w):
                os.close(fd)
            return False
        os.close(req_r)
        os.close(ans_w)
        kid = (made[0], req_w, ans_r)
        self._kids.append(kid)
        self._free.put(kid)
        return True

    def _serve(self, req: int, ans: int) -> None:
        """The child: answer each batch of ``(path, size_hint)`` with ``read_one``'s answer a file, or None
        where it raised, until the request pipe closes."""
        while True:
            head = read_exact(req, _HEADER.size)
            if len(head) < _HEADER.size:
                return
            (n,) = _HEADER.unpack(head)
            batch = pickle.loads(read_exact(req, n))
            out = []
            for path, hint in batch:
                try:
                    out.append(self._read_one(path, hint))
                except Exception:  # noqa: BLE001 - the reader reads it again and raises its error there
                    out.append(None)
            _send(ans, pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))

    def read_batch(self, files: list[tuple[str, int]]) -> list | None:
        """``read_one``'s answer for each ``(path, size_hint)`` (None where the child could not read it), or
        None when no child is free or the child failed (the caller reads them all)."""
        try:
            kid = self._free.get_nowait()
        except queue.Empty:
            return None
        pid, req, ans = kid
        try:
            _send(req, pickle.dumps(files, protocol=pickle.HIGHEST_PROTOCOL))
            head = read_exact(ans, _HEADER.size)
            if len(head) == _HEADER.size:
                (n,) = _HEADER.unpack(head)
                body = _read_into(ans, n)
                if body is not None:
                    out = pickle.loads(body)
                    if isinstance(out, list) and len(out) == len(files):
                        self._free.put(kid)
                        return out
        except (OSError, EOFError, pickle.UnpicklingError):
            pass
        self.dropped += 1  # not given back: no later batch waits on it; ``close`` reaps it
        return None

    def close(self, kill: bool = False) -> None:
        """End every child (closing its request pipe ends it) and reap it; ``kill``: end them at once."""
        kids, self._kids = self._kids, []
        for pid, req, ans in kids:
            reap(pid, (req, ans), kill=kill)


def _send(fd: int, payload: bytes) -> None:
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def _read_into(fd: int, n: int) -> "bytearray | None":
    """Exactly ``n`` bytes from ``fd`` in one buffer, or None when it ends first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if not k:
            return None
        got += k
    return buf

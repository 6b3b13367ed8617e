"""SIGTERM handled as Ctrl-C (a job scheduler's cancel or time limit, ``docker stop``); a hang-up carried on past.

``install`` (the command's entry point only, never a process that imports envvault as a library) makes
SIGTERM raise ``errors.Terminated``, a KeyboardInterrupt, in the main thread, so every command cleans up as
after Ctrl-C; a process started with SIGTERM ignored keeps ignoring it. SIGHUP (the terminal gone: an ssh
session dropped, a terminal window closed) is an accident, not a request to stop: the command finishes what it
was doing, as under ``nohup``, rather than leave a restore or a guard's rollback part way, and what it still has
to say goes to /dev/null (``hung_up``). A process started with SIGHUP ignored keeps ignoring it. ``held``
holds a SIGTERM back while a child process writes an environment (uv installing into it): Python kills a child
on a KeyboardInterrupt, and uv killed mid-install leaves the environment half changed; the SIGTERM is raised
once the child is done.
Built on ``_signal`` (built in): the ``signal`` module's import would cost every ``status`` 0.4 ms;
``errors`` is imported only when a SIGTERM comes.
"""

from __future__ import annotations

import _signal

__all__ = ["install", "held", "hung_up", "OWN_SESSION"]

# How envvault starts a child that does its own work (uv writing an environment, an interpreter probe, a dry
# run, nvidia-smi): ``subprocess.run(..., **OWN_SESSION)``, a session of its own, so that a hang-up, which an
# interactive shell passes on to the whole job, does not end it while envvault carries on past it (``nohup``'s
# ignored SIGHUP reaches its children too: helper 36 saw uv die of it and a restore fail). Ctrl-C reaches
# envvault, whose ``subprocess.run`` ends the child. The command ``guard`` runs stays in the job: it is the
# user's, and guard rolls back whatever it leaves.
OWN_SESSION = {"start_new_session": True}


def install() -> None:
    """SIGTERM raises ``Terminated`` in the main thread and SIGHUP is carried on past (``hung_up``), each unless
    it is ignored (or already handled)."""
    if _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL:
        _signal.signal(_signal.SIGTERM, _raise_terminated)
    if _signal.getsignal(_signal.SIGHUP) == _signal.SIG_DFL:
        _signal.signal(_signal.SIGHUP, hung_up)


def hung_up(_signum, _frame) -> None:
    """The terminal hung up: the command goes on. Each of stdin, stdout and stderr that is a character device (a
    terminal: a hung-up one fails every write with EIO, and one still open now may be gone at the next line) is
    pointed at /dev/null, so that a progress bar or the last line fails nothing and a question reads no answer
    (end of file); a file or a pipe stays as it is."""
    import os
    import stat

    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        for fd in (0, 1, 2):
            try:
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
            except OSError:  # closed: nothing is written to it
                pass
    finally:
        os.close(null)


def _raise_terminated(_signum, _frame) -> None:
    from envvault.errors import Terminated  # imported only then: every status starts here

    raise Terminated()


class held:  # noqa: N801 - used as a statement: ``with held():``
    """While inside, a SIGTERM is noted instead of raised (where ``install`` set it up, on the main thread);
    ``Terminated`` is raised on the way out when one came and nothing else is being raised."""

    def __enter__(self) -> "held":
        self.came = False
        self.old = _signal.getsignal(_signal.SIGTERM)
        self.active = self.old is _raise_terminated
        if self.active:
            try:
                _signal.signal(_signal.SIGTERM, self._note)
            except ValueError:  # not the main thread: left as it is
                self.active = False
        return self

    def _note(self, _signum, _frame) -> None:
        self.came = True

    def __exit__(self, kind, _value, _tb) -> None:
        if self.active:
            _signal.signal(_signal.SIGTERM, self.old)
        if self.came and kind is None:
            _raise_terminated(None, None)

"""SIGTERM handled as Ctrl-C (a job scheduler's cancel or time limit, ``docker stop``).

``install`` (the command's entry point only, never a process that imports envvault as a library) makes
SIGTERM raise ``errors.Terminated``, a KeyboardInterrupt, in the main thread, so every command cleans up as
after Ctrl-C; a process started with SIGTERM ignored keeps ignoring it. ``held`` holds it back while a child
process writes an environment (uv installing into it): Python kills a child on a KeyboardInterrupt, and uv
killed mid-install leaves the environment half changed; the SIGTERM is raised once the child is done.
Built on ``_signal`` (built in): the ``signal`` module's import would cost every ``status`` 0.4 ms;
``errors`` is imported only when a SIGTERM comes.
"""

from __future__ import annotations

import _signal

__all__ = ["install", "held"]


def install() -> None:
    """SIGTERM raises ``Terminated`` in the main thread, unless it is ignored."""
    if _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL:
        _signal.signal(_signal.SIGTERM, _raise_terminated)


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

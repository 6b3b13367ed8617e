"""One error root; each kind carries the exit code the CLI returns (see docs/cli.md)."""

from __future__ import annotations

__all__ = [
    "EnvvaultError",
    "UsageError",
    "NotFoundError",
    "AmbiguousError",
    "CorruptError",
    "StorageError",
    "RefusedError",
    "EnvironmentProblem",
    "Terminated",
]


class EnvvaultError(Exception):
    """Base of every error a user may see. ``str(err)`` is one line that says what to do next."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(EnvvaultError):
    """Bad arguments or a target that is not an environment."""

    exit_code = 2


class NotFoundError(EnvvaultError):
    """An id, tag, path or object that does not exist."""

    exit_code = 4


class AmbiguousError(NotFoundError):
    """An id prefix that names more than one snapshot."""


class CorruptError(EnvvaultError):
    """Stored data that fails its hash or does not parse."""

    exit_code = 5


class StorageError(EnvvaultError):
    """The vault cannot be written: read-only filesystem, full disk, permissions."""

    exit_code = 6


class RefusedError(EnvvaultError):
    """envvault declined on purpose: unsafe path, protected change without consent, ABI mismatch."""

    exit_code = 3


class EnvironmentProblem(EnvvaultError):
    """The environment itself is damaged (garbled METADATA/RECORD, unreadable file)."""

    exit_code = 7


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler's cancel or time limit, ``docker stop``): raised in the command's main thread
    as Ctrl-C's KeyboardInterrupt is, so every command cleans up as it does after Ctrl-C (a half-built
    ``--into`` venv removed, a snap's temp packs deleted, a restore's journal left for the next run); exit 143.
    Installed by ``terminate.install`` from the entry point only (never in a process that imports envvault as a
    library)."""

    exit_code = 143

    @staticmethod
    def behind(err: BaseException) -> bool:
        """``err`` (click's ``Abort``: click turns every KeyboardInterrupt into one) was raised by a SIGTERM."""
        return isinstance(err.__context__, Terminated)

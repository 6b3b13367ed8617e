"""Building the stamp a process writes into its checkpoints (docs/format.md, "Checkpoint stamps").

A stamp is a :class:`envvault.model.stamp.Stamp`: the snapshot that names the environment the process started
with (:mod:`envvault.torch.naming`) and its lock-level fingerprint (:mod:`envvault.torch.environment`), the
interpreter, torch and CUDA versions, host, argv, git work tree (:mod:`envvault.torch.gitstate`), chosen
environment variables, and per save the time, cwd and drift. What a process builds goes through the same
parser as what a reader finds, so every stamp written reads back.
"""

from __future__ import annotations

from envvault.model import records
import os
import socket
import sys
from pathlib import Path
from typing import Any

from envvault import __version__
from envvault.model.encoding import utc_timestamp
from envvault.model.stamp import STAMP_FORMAT, Drift, Stamp, parse_stamp
from envvault.torch.environment import EnvState, python_version
from envvault.torch.gitstate import git_state

__all__ = ["base_stamp", "with_snapshot", "for_save"]


def base_stamp(*, state: EnvState | None, snapshot: tuple[str, bool] | None, vault_root: str | None,
               prefix: Path, warnings: list[str]) -> Stamp:
    """The fields of a stamp that stay the same for the whole process (plain JSON types only: a
    ``TorchVersion`` would make ``torch.load(weights_only=True)`` refuse the checkpoint). Raises
    :class:`envvault.errors.CorruptError` when the process cannot be described in a stamp readers accept."""
    from envvault.env.host import relevant_env

    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    git = git_state(Path.cwd())
    doc = {
        "format": STAMP_FORMAT,
        "tool": f"envvault {__version__}",
        "snapshot": snapshot[0] if snapshot else None,
        "snapshot_lock_only": snapshot[1] if snapshot else None,
        "vault": vault_root,
        "fingerprint": state.fingerprint if state else None,
        "venv": str(prefix),
        "torch": str(torch.__version__) if torch is not None and hasattr(torch, "__version__") else None,
        "cuda": _plain(getattr(version, "cuda", None)),
        "python": python_version(),
        "executable": sys.executable,
        "host": socket.gethostname(),
        "argv": [str(a) for a in sys.argv],
        "git": git.to_dict() if git else None,
        "env": relevant_env(),
        "warnings": list(warnings),
        "drift": None, "time": None, "cwd": None,  # per save: for_save
    }
    return parse_stamp(doc, "the stamp of this process")


def with_snapshot(base: Stamp, snapshot: tuple[str, bool] | None, warnings: list[str]) -> Stamp:
    """``base`` naming ``(id, lock_only)`` (or keeping what it named), with these warnings."""
    if snapshot is None:
        return records.replace(base, warnings=tuple(warnings))
    return records.replace(base, snapshot=snapshot[0], snapshot_lock_only=snapshot[1], warnings=tuple(warnings))


def for_save(base: Stamp, drift: Drift | None) -> dict[str, Any]:
    """The stamp one save writes: ``base`` with the drift, the time (UTC, milliseconds) and the cwd, as a
    fresh dict of plain JSON types."""
    try:
        cwd = os.getcwd()
    except OSError:  # a working folder deleted since the run started: the stamp says none
        cwd = None
    return records.replace(base, drift=drift, time=utc_timestamp(3), cwd=cwd).to_dict()


def _plain(value: Any) -> str | None:
    return None if value is None else str(value)

"""The environment reader seam: what envvault needs to know about an environment it snapshots, whatever
kind it is. Two kinds: a virtual environment (``venv.py``) and an interpreter's own installation as it sees
it (``system.py``: every site directory, the user site included); a conda environment would be one more
class with these members, and ``reader_for`` choosing it.

A reader changes nothing and keeps no state beyond memoised answers. Two kinds of facts:

- the interpreter's (``interpreter``, ``site_dirs``): asked of the environment's own Python, which costs a
  subprocess, so a ``memo`` (the snap's stat cache) keeps the answer while the files it depends on are
  unchanged;
- the files' (``python_version``, ``site_packages``): read from the folder alone, never running anything,
  for cache fingerprints and which caches an environment can use.

``dist_entries`` lists the distribution entries (``*.dist-info``, ``*.egg-info``, ``*.egg-link``) of the
site directories without reading them, so that a snap can skip an unchanged one by its stats alone;
``read`` parses one (``envvault.env.dists``); ``distributions`` is both.
"""

from __future__ import annotations

from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Protocol

    from envvault.env.dists import InstalledDist
    from envvault.env.probe import Interpreter
else:
    from envvault.runtime_types import Protocol

__all__ = ["EnvironmentReader", "Memo", "reader_for"]


class Memo(Protocol):
    """Where a reader may keep answers between runs (``envvault.vault.statcache.StatCache`` is one)."""

    extra: dict[str, Any]

    def mark_dirty(self) -> None: ...


class EnvironmentReader(Protocol):
    """One environment, read without changing it."""

    kind: str  # "venv" or "system"
    prefix: Path  # as given (paths in a snapshot are relative to it)
    stashed: list[Path]  # the entries the last ``dist_entries`` passed over: pip stashes, names not UTF-8 (``entries.entry_kind``)

    def interpreter(self) -> Interpreter:
        """Identity and install paths, from the environment's own interpreter (memoised)."""
        ...

    def site_dirs(self) -> list[Path]:
        """The folders distributions are installed into (purelib, platlib), first wins."""
        ...

    def dist_entries(self) -> list[tuple[Path, Path]]:
        """``(entry, site)`` for every distribution entry of ``site_dirs`` (``env/entries.entry_kind`` "dist"), sorted by
        entry name; the entries passed over are kept in ``stashed``."""
        ...

    def read(self, entry: Path, site: Path) -> InstalledDist | None:
        """One entry of ``dist_entries`` parsed (None: an egg-info that cannot be read)."""
        ...

    def distributions(self) -> list[InstalledDist]:
        """Every readable distribution, in ``dist_entries`` order."""
        ...

    def python_version(self) -> str | None:
        """The Python version the files say (``X.Y.Z`` or ``X.Y``), without running anything."""
        ...

    def site_packages(self) -> Path:
        """The main site directory as the files say, without running anything; ``UsageError`` if none."""
        ...


def reader_for(prefix: Path, memo: Memo | None = None) -> EnvironmentReader:
    """The reader for the environment at ``prefix`` (``find_target`` has already refused what is not a
    supported environment): the system environment registered for it, else a virtual environment."""
    from envvault.env.probe import system_of

    hit = system_of(prefix)
    if hit is not None:
        from envvault.env.system import SystemReader

        return SystemReader(Path(prefix), hit[0], memo, hit[1])
    from envvault.env.venv import VenvReader

    return VenvReader(prefix, memo)

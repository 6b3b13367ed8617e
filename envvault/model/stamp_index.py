"""The stamp index (``state/stamp-index.json``): typed entries and their parser (docs/format.md,
"Checkpoint stamps").

A machine-local cache: :func:`parse_stamp_index` keeps the entries that parse and drops the rest (a dropped
entry is computed again), and an index written by another envvault version reads as empty. Standard library
only, like :mod:`envvault.model.stamp`.
"""

from __future__ import annotations

import re
from envvault.model.records import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from envvault.errors import CorruptError
from envvault.model.stamp import MAX_PATH, MAX_TEXT, Problems

__all__ = ["INDEX_VERSION", "IndexedSnapshot", "IndexedState", "StampIndex", "parse_index_entry",
           "parse_state_entry", "parse_stamp_index"]

# 3: identity version 2 (build ids leave scripts out); 4: missing files and trigger kept.
INDEX_VERSION = 4
_ID = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class IndexedSnapshot:
    """What the stamp index remembers of one snapshot (snapshot files never change). On disk a list:
    ``[fingerprint, lock_only, created, venv, lock-level fingerprint, missing files, trigger]``."""

    fingerprint: str | None
    lock_only: bool
    created: str
    venv: str
    lock_fingerprint: str | None
    missing: int
    trigger: str

    def to_json(self) -> list:
        return [self.fingerprint, self.lock_only, self.created, self.venv, self.lock_fingerprint, self.missing,
                self.trigger]

    def rank(self) -> tuple:
        """Larger is better among snapshots of one lock-level fingerprint (docs/format.md): a full one, then
        one without missing files, then one not taken as a restore's backup, then the newest."""
        return (not self.lock_only, self.missing == 0, self.trigger != "restore-backup", self.created)


@dataclass(frozen=True, slots=True)
class IndexedState:
    """A remembered environment state: its lock-level fingerprint and ``(name, version, build id)`` per
    package. On disk ``[fingerprint, [[name, version, build id], ...]]``."""

    fingerprint: str
    packages: tuple[tuple[str, str, str], ...]

    def to_json(self) -> list:
        return [self.fingerprint, [list(p) for p in self.packages]]


def _id_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and _ID.fullmatch(value) is not None)


def parse_index_entry(obj: object, where: str) -> IndexedSnapshot:
    """One ``snapshots`` entry of the stamp index; :class:`CorruptError` naming every problem."""
    if not isinstance(obj, list) or len(obj) != 7:
        raise CorruptError(f"{where}: expected a list of 7 values")
    fp, lock_only, created, venv, lock_fp, missing, trigger = obj
    problems = Problems()
    if not _id_or_none(fp):
        problems.add(f"{where}[0]", "expected a 64-hex id or null")
    if not isinstance(lock_only, bool):
        problems.add(f"{where}[1]", "expected true or false")
    for i, v in ((2, created), (3, venv), (6, trigger)):
        if not isinstance(v, str) or len(v) > MAX_PATH:
            problems.add(f"{where}[{i}]", "expected a string")
    if not _id_or_none(lock_fp):
        problems.add(f"{where}[4]", "expected a 64-hex id or null")
    if type(missing) is not int or missing < 0:
        problems.add(f"{where}[5]", "expected a count")
    problems.raise_if_any(where)
    return IndexedSnapshot(fp, lock_only, created, venv, lock_fp, missing, trigger)


def parse_state_entry(obj: object, where: str) -> IndexedState:
    """One ``states`` entry of the stamp index; :class:`CorruptError` naming every problem."""
    if not isinstance(obj, list) or len(obj) != 2:
        raise CorruptError(f"{where}: expected [fingerprint, packages]")
    fp, raw = obj
    problems = Problems()
    if not isinstance(fp, str) or not _ID.fullmatch(fp):
        problems.add(f"{where}[0]", "expected a 64-hex id")
    packages = []
    if not isinstance(raw, list):
        problems.add(f"{where}[1]", "expected a list of [name, version, build id]")
    else:
        for i, p in enumerate(raw):
            if (not isinstance(p, list) or len(p) != 3
                    or not all(isinstance(s, str) and len(s) <= MAX_TEXT for s in p)):
                problems.add(f"{where}[1][{i}]", "expected [name, version, build id]")
            else:
                packages.append(tuple(p))
    problems.raise_if_any(where)
    return IndexedState(fp, tuple(packages))


@dataclass(frozen=True, slots=True)
class StampIndex:
    """``state/stamp-index.json``: ``{"tool", "version", "snapshots": {id: entry}, "states": {key: entry}}``
    (``states`` oldest first)."""

    tool: str
    snapshots: Mapping[str, IndexedSnapshot]
    states: Mapping[str, IndexedState]

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "version": INDEX_VERSION,
                "snapshots": {sid: e.to_json() for sid, e in self.snapshots.items()},
                "states": {key: e.to_json() for key, e in self.states.items()}}


def parse_stamp_index(doc: object, tool: str) -> StampIndex:
    """The index written by envvault ``tool``: an index of another tool or index version, or not an index,
    reads as empty; entries that do not parse are left out (each is computed again). Never raises."""
    if not isinstance(doc, dict) or doc.get("tool") != tool or doc.get("version") != INDEX_VERSION:
        doc = {}
    snapshots: dict[str, IndexedSnapshot] = {}
    raw = doc.get("snapshots")
    for sid, entry in raw.items() if isinstance(raw, dict) else ():
        try:
            if _ID.fullmatch(sid):
                snapshots[sid] = parse_index_entry(entry, f"snapshots[{sid[:12]}]")
        except CorruptError:
            pass
    states: dict[str, IndexedState] = {}
    raw = doc.get("states")
    for key, entry in raw.items() if isinstance(raw, dict) else ():
        try:
            states[key] = parse_state_entry(entry, f"states[{key[:12]}]")
        except CorruptError:
            pass
    return StampIndex(tool, MappingProxyType(snapshots), MappingProxyType(states))

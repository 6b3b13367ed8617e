"""The stamp index, ``state/stamp-index.json``: what stamping remembers between processes of one machine.

``snapshots``: the facts of each snapshot stamps are matched by (snapshot files never change, so each is read
once per vault, not once per process); ``states``: the lock-level state of recently seen environments, keyed
by their dist-info signature (at most 64, oldest dropped first). A cache (docs/format.md): deleting it costs
only speed, an unreadable one or one another envvault version wrote reads as empty, and a failed write is
ignored. Records and their parser: :mod:`envvault.model.stamp_index`.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from envvault import __version__
from envvault.errors import EnvvaultError
from envvault.model import identity
from envvault.model.stamp_index import IndexedSnapshot, IndexedState, StampIndex, parse_stamp_index
from envvault.model.encoding import json_loads

if TYPE_CHECKING:
    from envvault.model.snapshot import Snapshot

__all__ = ["load", "save", "remember_state", "snapshot_facts", "indexed_snapshot", "lock_fingerprint"]

INDEX_NAME = "stamp-index.json"
MAX_STATES = 64
_MAX_BYTES = 64 << 20


def load(vault) -> StampIndex:
    """The index as stored (entries that do not parse left out), or an empty one."""
    raw = vault.state.read(INDEX_NAME, _MAX_BYTES, "stamp index")
    try:
        doc = json_loads(raw) if raw is not None else None
    except ValueError:
        doc = None
    return parse_stamp_index(doc, __version__)


def save(vault, index: StampIndex) -> None:
    """Replace the index (not durably: a cache); a vault that cannot be written keeps the old one."""
    data = json.dumps(index.to_dict(), separators=(",", ":")).encode()
    try:
        vault.state.write(INDEX_NAME, data, durable=False)
    except EnvvaultError:
        pass  # the next process does the work again


def remember_state(vault, key: str, state: IndexedState) -> None:
    """Add (or refresh, as the newest) the state under ``key``, dropping the oldest beyond :data:`MAX_STATES`."""
    index = load(vault)
    states = {k: v for k, v in index.states.items() if k != key}
    states[key] = state
    kept = dict(list(states.items())[-MAX_STATES:])  # oldest first
    save(vault, StampIndex(index.tool, index.snapshots, MappingProxyType(kept)))


def lock_fingerprint(snapshot: Snapshot) -> str | None:
    """A snapshot's lock-level fingerprint (what stamps carry): its fingerprint with each package's build id
    in place of its state id. Equal to ``fingerprint`` for a lock-only snapshot and for a full one without
    edits; a full snapshot of an environment with edited files (an appended CA in certifi) differs only here.
    None for a snapshot without one (a cache-only snapshot)."""
    if snapshot.fingerprint is None or not snapshot.python.version:
        return None
    return identity.lock_fingerprint(snapshot.python.version,
                                     [(p.name, p.version, p.build_id) for p in snapshot.packages])


def indexed_snapshot(snapshot: Snapshot) -> IndexedSnapshot:
    """The facts the index keeps of a snapshot."""
    return IndexedSnapshot(snapshot.fingerprint, snapshot.lock_only, snapshot.created, snapshot.venv or "",
                           lock_fingerprint(snapshot), sum(len(p.missing) for p in snapshot.packages),
                           snapshot.trigger or "")


def snapshot_facts(vault) -> Mapping[str, IndexedSnapshot]:
    """The facts of every snapshot now in the vault: from the index, reading only the snapshots it does not
    know yet (a damaged one is left out); the index is saved when it changed."""
    index = load(vault)
    ids = set(vault.snapshot_ids())
    known = {sid: e for sid, e in index.snapshots.items() if sid in ids}
    changed = len(known) != len(index.snapshots)
    for sid in ids - known.keys():
        try:
            snapshot = vault.load_snapshot(sid).snapshot
        except EnvvaultError:
            continue
        known[sid] = indexed_snapshot(snapshot)
        changed = True
    if changed:
        save(vault, StampIndex(index.tool, MappingProxyType(known), index.states))
    return MappingProxyType(known)

"""The heads of a vault's snapshots for ``list``, ``status`` and ``latest`` (docs/format.md, "Snapshot heads"),
below ``store.py`` (it reaches the vault only through the ``Vault`` it is given): from the node's
``state/snapshot-heads.json``, else from what the backend holds of them (a bucket's ``heads/`` objects), else
computed from the document, which is loaded and parsed as ``Vault.load_snapshot`` does. What was computed is
saved for the next listing, and handed to a backend that shares heads with other nodes."""

from __future__ import annotations

import json
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Protocol
else:
    from envvault.runtime_types import Protocol

from envvault.errors import CorruptError
from envvault.model.heads import SnapshotHead, head_of, parse_head
from envvault.model.encoding import json_loads



class Vault(Protocol):
    """What this module uses of ``store.Vault`` (which builds on it, for ``latest``)."""

    backend: Any
    state: Any

    def snapshot_ids(self) -> list[str]: ...

    def load_listed(self, sid: str) -> Any: ...

__all__ = ["snapshot_heads", "newest_head", "STATE_NAME"]

STATE_NAME = "snapshot-heads.json"
_LIMIT = 64 << 20


def _saved(vault: Vault) -> dict[str, SnapshotHead]:
    """The node's saved heads; {} when there are none or the file does not parse (it is then rebuilt)."""
    try:
        raw = vault.state.read(STATE_NAME, _LIMIT, "snapshot heads")
        if raw is None:
            return {}
        doc = json_loads(raw)
        if doc.get("version") != 1:
            return {}
        return {sid: parse_head(h) for sid, h in doc["heads"].items()}
    except (CorruptError, ValueError, AttributeError, KeyError, TypeError, OSError):
        return {}


def snapshot_heads(vault: Vault, *, trust_saved: bool = True) -> list[tuple[str, SnapshotHead]]:
    """``(id, head)`` of every readable snapshot, newest first. A snapshot that does not load is skipped
    (``Vault.load_listed``), as ``Vault.snapshots`` does. ``trust_saved=False`` computes every head from its
    document (and saves them), as after a head that did not match its document (``newest_head``)."""
    ids = vault.snapshot_ids()
    saved = _saved(vault) if trust_saved else {}
    heads = {sid: saved[sid] for sid in ids if sid in saved}
    missing = [sid for sid in ids if sid not in heads]
    shared = getattr(vault.backend, "shared_heads", None)
    hints: set[str] = set()  # heads from the bucket's heads objects: shown, never kept as this node's own
    if missing and shared is not None and trust_saved:
        for sid, h in shared(set(missing)).items():
            try:
                heads[sid] = parse_head(h)
                hints.add(sid)
            except CorruptError:
                continue
    computed = 0
    for sid in ids:
        if sid in heads:
            continue
        ref = vault.load_listed(sid)
        if ref is not None:
            heads[sid] = head_of(ref.snapshot)
            computed += 1
    own = {sid: h for sid, h in heads.items() if sid not in hints}
    if own.keys() != saved.keys() or not trust_saved:
        data = json.dumps({"version": 1, "heads": {sid: h.to_dict() for sid, h in sorted(own.items())}},
                          sort_keys=True, separators=(",", ":")).encode()
        try:
            vault.state.write(STATE_NAME, data, durable=False)
        except OSError:
            pass  # a cache: the next listing computes them again
    remember = getattr(vault.backend, "remember_heads", None)
    if remember is not None:
        remember({sid: h.to_dict() for sid, h in heads.items()}, computed)
    return sorted(heads.items(), key=lambda kv: (kv[1].created, kv[0]), reverse=True)


def newest_head(vault: Vault, wanted: Callable[[SnapshotHead], bool]) -> tuple[str, SnapshotHead] | None:
    """``(id, head)`` of the newest snapshot whose head ``wanted`` takes, checked against its document: saved
    and shared heads lie outside the vault's data (a copied vault brings its ``state/``; a bucket's heads are
    anyone's), so a head that is not its document's drops them and the choice is made from the documents."""
    for trust in (True, False):
        hit = next(((sid, h) for sid, h in snapshot_heads(vault, trust_saved=trust) if wanted(h)), None)
        if hit is None:
            return None
        ref = vault.load_listed(hit[0])
        if ref is not None and head_of(ref.snapshot).to_dict() == hit[1].to_dict():
            return hit
    return None

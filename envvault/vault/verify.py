"""verify: re-hash every object the snapshots reference, and say which snapshots damage breaks."""

from __future__ import annotations

from envvault.errors import CorruptError, EnvvaultError
from envvault.model.encoding import object_id
from envvault.model.manifest import manifest_blob_ids
from envvault.model.snapshot import Snapshot, parse_snapshot
from envvault.vault.packs import read_frame
from envvault.vault.store import Vault

__all__ = ["verify_vault", "referenced_objects"]


def referenced_objects(vault: Vault, snap: Snapshot | dict, problems: dict | None = None, sid: str = "") -> set[str]:
    """Every object id a snapshot needs: manifests and the blobs they list (read leniently: gc keeps, and
    verify re-hashes, what even a manifest a restore would refuse names)."""
    if not isinstance(snap, Snapshot):
        snap = parse_snapshot(snap, f"snapshot {sid[:12]}")
    needed: set[str] = set()
    for mid in snap.manifest_ids():
        needed.add(mid)
        try:
            man = vault.get_json(mid)
        except EnvvaultError as err:
            if problems is not None:
                problems.setdefault(mid, {"problem": str(err), "snapshots": set()})["snapshots"].add(sid)
            continue
        needed.update(manifest_blob_ids(man))
    return needed


def verify_vault(vault: Vault, only: list[str] | None = None) -> dict:
    """Re-read every referenced frame, re-hash every object. Returns a JSON-able report."""
    problems: dict[str, dict] = {}
    users: dict[str, set[str]] = {}
    snap_ids = only or vault.snapshot_ids()
    checked_snaps = 0
    for sid in snap_ids:
        try:
            ref = vault.load_snapshot(sid)
        except EnvvaultError as err:
            problems.setdefault(sid, {"problem": f"snapshot unreadable: {err}", "snapshots": set()})["snapshots"].add(sid)
            continue
        checked_snaps += 1
        for oid in referenced_objects(vault, ref.snapshot, problems, sid):
            users.setdefault(oid, set()).add(sid)
    index = vault.index()
    # Group by frame so each frame is read and decompressed once.
    frames: dict[tuple, list[str]] = {}
    for oid in users:
        loc = index.get(oid)
        if loc is None:
            problems.setdefault(oid, {"problem": "missing", "snapshots": set()})
            continue
        frames.setdefault((loc[0], loc[1], loc[2]), []).append(oid)
    total_bytes = 0
    for (pack, fo, fl), oids in sorted(frames.items()):
        try:
            frame = read_frame(vault.backend, pack, fo, fl)
        except CorruptError as err:
            for oid in oids:
                problems.setdefault(oid, {"problem": str(err), "snapshots": set()})
            continue
        for oid in oids:
            _, _, _, off, length, _ = index[oid]
            data = frame[off : off + length]
            total_bytes += len(data)
            if len(data) != length or object_id(data) != oid:
                problems.setdefault(oid, {"problem": f"damaged (hash mismatch in pack {pack[:12]})", "snapshots": set()})
    for oid, p in problems.items():
        p["snapshots"] = sorted(p["snapshots"] | users.get(oid, set()))
    return {
        "ok": not problems,
        "snapshots": checked_snaps,
        "objects": len(users),
        "bytes": total_bytes,
        "problems": [{"object": oid, **p} for oid, p in sorted(problems.items())],
    }

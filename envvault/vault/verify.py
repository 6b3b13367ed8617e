"""verify: check that every snapshot and what it references is there and parses (by default), or also re-read
and re-hash every object (``read_data``); say which snapshots damage breaks."""

from __future__ import annotations

from envvault.errors import CorruptError, EnvvaultError
from envvault.model.encoding import object_id, parse_json
from envvault.model.cache import parse_manifest as parse_cache_manifest
from envvault.model.manifest import manifest_blob_ids, parse_dist_manifest
from envvault.model.snapshot import Snapshot, parse_snapshot
from envvault.vault.packs import check_frame, read_frame
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


def verify_vault(vault: Vault, only: list[str] | None = None, *, read_data: bool = False) -> dict:
    """Check the snapshots (all, or ``only``) and what they reference; a JSON-able report.

    By default the structure: every snapshot and manifest parses (each manifest is read and re-hashed:
    small), every object a manifest names is in the index, every pack the index names for them is in the
    packs listing (one LIST; no blob's frame read), and every frame the index claims is one a pack writer
    makes (``packs.check_frame``). ``read_data`` also reads every frame that holds a referenced
    object and re-hashes every object: what ``verify --read-data`` costs on a bucket."""
    problems: dict[str, dict] = {}
    users: dict[str, set[str]] = {}
    snap_ids = only or vault.snapshot_ids()
    checked_snaps = 0
    blobs_of: dict[str, list[str]] = {}  # manifest id -> the blobs it names (each manifest read once)
    manifest_bytes = 0
    for sid in snap_ids:
        try:
            ref = vault.load_snapshot(sid, from_disk=True)
        except EnvvaultError as err:
            problems.setdefault(sid, {"problem": f"snapshot unreadable: {err}", "snapshots": set()})["snapshots"].add(sid)
            continue
        checked_snaps += 1
        snap = ref.snapshot
        cache_ids = {c.manifest for c in snap.caches or () if c.manifest}
        for mid in snap.manifest_ids():
            users.setdefault(mid, set()).add(sid)
            if mid not in blobs_of:
                blobs_of[mid], size = _manifest_blobs(vault, mid, mid in cache_ids, problems)
                manifest_bytes += size
            for oid in blobs_of[mid]:
                users.setdefault(oid, set()).add(sid)
    index = vault.index()
    frames: dict[tuple, list[str]] = {}
    for oid in users:
        loc = index.get(oid)
        if loc is None:
            problems.setdefault(oid, {"problem": "missing", "snapshots": set()})
            continue
        frames.setdefault((loc[0], loc[1], loc[2]), []).append(oid)
    packs = set(vault.backend.list("packs"))
    for (pack, fo, fl), oids in frames.items():
        if pack not in packs:
            for oid in oids:
                problems.setdefault(oid, {"problem": f"missing (its pack {pack[:12]} is gone)", "snapshots": set()})
            continue
        try:
            check_frame(pack, fo, fl)  # what the index claims, checked without reading the frame
        except CorruptError as err:
            for oid in oids:
                problems.setdefault(oid, {"problem": str(err), "snapshots": set()})
    total_bytes = _read_frames(vault, frames, packs, index, problems) if read_data else manifest_bytes
    for oid, p in problems.items():
        p["snapshots"] = sorted(p["snapshots"] | users.get(oid, set()))
    return {
        "ok": not problems,
        "read_data": read_data,
        "snapshots": checked_snaps,
        "objects": len(users),
        "bytes": total_bytes,
        "problems": [{"object": oid, **p} for oid, p in sorted(problems.items())],
    }


def _manifest_blobs(vault: Vault, mid: str, cache: bool, problems: dict) -> tuple[list[str], int]:
    """The blob ids manifest ``mid`` names, read leniently; a manifest that is missing, damaged or does not
    parse (``parse_dist_manifest``, or the cache tree's ``parse_manifest``) is a problem; and its size."""
    try:
        data = vault.get(mid)
        doc = parse_json(data, f"manifest {mid[:12]}")
    except EnvvaultError as err:
        problems.setdefault(mid, {"problem": str(err), "snapshots": set()})
        return [], 0
    try:
        if cache:
            parse_cache_manifest(doc, f"cache manifest {mid[:12]}")
        else:
            parse_dist_manifest(doc, f"manifest {mid[:12]}")
    except EnvvaultError as err:
        problems.setdefault(mid, {"problem": str(err), "snapshots": set()})
    return manifest_blob_ids(doc), len(data)


def _read_frames(vault: Vault, frames: dict[tuple, list[str]], packs: set[str], index: dict, problems: dict) -> int:
    """Read each frame once, in pack order, and re-hash every object in it; the bytes hashed."""
    total = 0
    for (pack, fo, fl), oids in sorted(frames.items()):
        if pack not in packs:
            continue
        try:
            frame = read_frame(vault.backend, pack, fo, fl)
        except CorruptError as err:
            for oid in oids:
                problems.setdefault(oid, {"problem": str(err), "snapshots": set()})
            continue
        for oid in oids:
            _, _, _, off, length, _ = index[oid]
            data = frame[off : off + length]
            total += len(data)
            if len(data) != length or object_id(data) != oid:
                problems.setdefault(oid, {"problem": f"damaged (hash mismatch in pack {pack[:12]})", "snapshots": set()})
    return total

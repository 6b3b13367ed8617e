"""What differs between the caches of two snapshots, as data: fingerprints side by side, entries compared.

Caches are paired by kind and root, then the rest by kind in order. Entries are the logical units of
``snap.entry_key`` (an FX graph, a Triton kernel folder, a generated kernel file); an entry is ``changed``
when any of its files differs in content or mode.
"""

from __future__ import annotations

from envvault.model.records import dataclass

from ..model.cache import parse_manifest
from ..model.snapshot import CacheEntry, Snapshot, as_snapshot
from .entries import entry_key, summarise_entries

__all__ = ["FingerprintRow", "CachePair", "CacheDiff", "diff_caches", "fingerprint_rows"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FingerprintRow:
    label: str
    a: str | None
    b: str | None

    @property
    def differs(self) -> bool:
        return self.a != self.b


@dataclass(frozen=True, slots=True, kw_only=True)
class CachePair:
    """One cache of A beside its counterpart in B (either may be missing)."""

    kind: str
    root_a: str | None
    root_b: str | None
    fingerprint: tuple[FingerprintRow, ...]
    entries_a: dict[str, int]
    entries_b: dict[str, int]
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    same: int = 0

    def to_json(self) -> dict:
        return {
            "kind": self.kind, "root_a": self.root_a, "root_b": self.root_b,
            "fingerprint": [{"label": r.label, "a": r.a, "b": r.b, "differs": r.differs} for r in self.fingerprint],
            "entries_a": self.entries_a, "entries_b": self.entries_b,
            "only_a": list(self.only_a), "only_b": list(self.only_b), "changed": list(self.changed), "same": self.same,
        }  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheDiff:
    a: str
    b: str
    pairs: tuple[CachePair, ...]

    @property
    def empty(self) -> bool:
        return all(not (p.only_a or p.only_b or p.changed or any(r.differs for r in p.fingerprint)) for p in self.pairs)

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "same": self.empty, "caches": [p.to_json() for p in self.pairs]}


def fingerprint_rows(a: dict | None, b: dict | None) -> tuple[FingerprintRow, ...]:
    """Fingerprint dicts (``Fingerprint.to_dict``) as labelled rows; a missing value is None."""
    def rows(fp: dict | None) -> dict[str, str | None]:
        if not fp:
            return {}
        t, tr = fp.get("torch") or {}, fp.get("triton") or {}
        gpus = fp.get("gpus")
        out = {
            "torch": t.get("version"), "torch git": _short(t.get("git_version")), "torch cuda": t.get("cuda"),
            "torch hip": t.get("hip"), "torch key": _short(t.get("key_hash")), "torch RECORD": _short(t.get("record_blake3")),
            "triton": tr.get("version"), "triton RECORD": _short(tr.get("record_blake3")),
            "gpus": None if gpus is None else (", ".join(
                f"{g.get('name')}" + (f" ({g['compute_cap']})" if g.get("compute_cap") else "") for g in gpus) or "none"),
            "python": fp.get("python"),
        }  # fmt: skip
        for k, v in sorted((fp.get("env") or {}).items()):
            out[f"env {k}"] = v
        return out

    ra, rb = rows(a), rows(b)
    labels = list(ra) + [k for k in rb if k not in ra]
    return tuple(FingerprintRow(label=k, a=ra.get(k), b=rb.get(k)) for k in labels
                 if ra.get(k) is not None or rb.get(k) is not None)


def diff_caches(vault, doc_a: Snapshot | dict, doc_b: Snapshot | dict, *, label_a: str = "A",
                label_b: str = "B") -> CacheDiff:
    """Compare the caches of two snapshots; reads (and validates) their manifests."""
    a = list(as_snapshot(doc_a).caches or ())
    b = list(as_snapshot(doc_b).caches or ())
    pairs: list[tuple[CacheEntry | None, CacheEntry | None]] = []
    rest_b = list(b)
    unpaired_a = []
    for ca in a:
        match = next((cb for cb in rest_b if cb.kind == ca.kind and cb.root == ca.root), None)
        if match is None:
            unpaired_a.append(ca)
        else:
            rest_b.remove(match)
            pairs.append((ca, match))
    for ca in unpaired_a:
        match = next((cb for cb in rest_b if cb.kind == ca.kind), None)
        if match is not None:
            rest_b.remove(match)
        pairs.append((ca, match))
    pairs += [(None, cb) for cb in rest_b]
    return CacheDiff(a=label_a, b=label_b, pairs=tuple(_pair(vault, ca, cb) for ca, cb in pairs))


def _pair(vault, ca: CacheEntry | None, cb: CacheEntry | None) -> CachePair:
    kind = (ca or cb).kind or "?"
    (files_a, regular_a), (files_b, regular_b) = _files(vault, ca), _files(vault, cb)
    ents_a = _by_entry(kind, files_a)
    ents_b = _by_entry(kind, files_b)
    changed = sorted(k for k in ents_a.keys() & ents_b.keys() if ents_a[k] != ents_b[k])
    return CachePair(
        kind=kind,
        root_a=ca.root if ca else None,
        root_b=cb.root if cb else None,
        fingerprint=fingerprint_rows(ca.fingerprint if ca else None, cb.fingerprint if cb else None),
        entries_a=summarise_entries(kind, regular_a),  # counted as the snapshot counts them (archive.py)
        entries_b=summarise_entries(kind, regular_b),
        only_a=tuple(sorted(ents_a.keys() - ents_b.keys())),
        only_b=tuple(sorted(ents_b.keys() - ents_a.keys())),
        changed=tuple(changed),
        same=len(ents_a.keys() & ents_b.keys()) - len(changed),
    )


def _files(vault, entry: CacheEntry | None) -> tuple[dict[str, tuple], list[str]]:
    """The cache's files and symlinks (path -> what it holds), and the paths of its regular files."""
    if entry is None or entry.manifest is None:
        return {}, []
    mid = entry.manifest
    manifest = parse_manifest(vault.get_json(mid), f"cache manifest {mid[:12]}")
    return ({f.path: (f.sha256 or f.target, f.mode) for f in manifest.files if f.kind != "dir"},
            [f.path for f in manifest.files if f.kind == "file"])


def _by_entry(kind: str, files: dict[str, tuple]) -> dict[str, frozenset]:
    out: dict[str, set] = {}
    for path, value in files.items():
        out.setdefault(entry_key(kind, path), set()).add((path, value))
    return {k: frozenset(v) for k, v in out.items()}


def _short(value: str | None) -> str | None:
    return value[:12] if isinstance(value, str) else value

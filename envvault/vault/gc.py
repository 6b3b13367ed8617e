"""gc: forget old snapshots and delete the objects no kept snapshot references.

Runs under the exclusive vault lock (snaps and restores hold it shared), so no snapshot is committed while
gc decides what is live. Deletion goes in the reverse of the write order: snapshot files first (the commit
points), then index files, then packs; a gc killed half-way leaves only more garbage for the next one.

Packs: a pack with no live object is deleted. A pack whose dead objects make up at least
``REWRITE_DEAD_FRACTION`` of its (uncompressed) bytes is rewritten: its live objects are copied into new
packs (made durable with their index files first), then the old index and pack are deleted. Packs with
less garbage are kept whole; their dead objects stay until more of the pack dies.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Iterator

from envvault.model.records import dataclass, field

from envvault.crashpoints import crash_point
from envvault.errors import CorruptError, EnvvaultError
from envvault.model.encoding import object_id
from envvault.model.snapshot import is_id
from envvault.vault.backend import Missing
from envvault.vault.packs import read_frame
from envvault.vault.store import Vault, read_index
from envvault.vault.transaction import pack_writing
from envvault.vault.verify import referenced_objects

__all__ = ["GcResult", "collect_garbage", "guarded_snapshots", "guard_lease", "guard_note", "read_guard_note", "GUARD_LOCK",
           "REWRITE_DEAD_FRACTION"]

REWRITE_DEAD_FRACTION = 0.25
_TMP_AGE = 60.0  # seconds; younger temp files may belong to a status or export running without the lock


@dataclass(frozen=True)
class GcResult:
    dry_run: bool
    kept_snapshots: tuple[str, ...]
    removed_snapshots: tuple[str, ...]
    removed_packs: int = 0
    rewritten_packs: int = 0
    kept_partial_packs: int = 0
    removed_objects: int = 0
    freed_bytes: int = 0  # pack bytes deleted minus bytes written by rewrites (estimated in a dry run)
    warnings: tuple[str, ...] = field(default_factory=tuple)
    kept_for_guards: tuple[str, ...] = ()  # kept only or also because a running guard needs them

    def to_json(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "kept_snapshots": len(self.kept_snapshots),
            "removed_snapshots": list(self.removed_snapshots),
            "removed_packs": self.removed_packs,
            "rewritten_packs": self.rewritten_packs,
            "kept_partial_packs": self.kept_partial_packs,
            "removed_objects": self.removed_objects,
            "freed_bytes": self.freed_bytes,
            "warnings": list(self.warnings),
            "kept_for_guards": list(self.kept_for_guards),
        }


GUARD_LOCK = "guard-"  # a guard's lock: ``locks/guard-<key>[-<ikey>].lock`` (envvault/guard/run.py)


def guard_note(pid: int, sid: str | None = None) -> str:
    """What a guard writes into its lock file: its process id (as it takes the lock), then the id of its
    "before" snapshot (once committed); docs/format.md, "Concurrency"."""
    return f"{pid}\n" + (f"{sid}\n" if sid else "")


def read_guard_note(text: str) -> tuple[int | None, str | None]:
    """``(pid, before id)`` of a ``guard_note``; None for a part missing or malformed."""
    lines = text.split("\n")
    pid = int(lines[0]) if lines[0].isdigit() and len(lines[0]) < 12 else None
    sid = lines[1] if len(lines) > 1 and is_id(lines[1]) else None
    return pid, sid


def guarded_snapshots(vault: Vault, *, clean: bool = True) -> set[str]:
    """Ids of the "before" snapshots of the guards running now: each guard writes its id into its lock file
    (``guard_note``) under the vault lock that commits it, and holds that lock until its rollback is done; in
    a vault whose lock is lock objects, a guard on any node also holds a lease naming it (``guard_lease``;
    stale ones deleted when ``clean``). gc keeps them as it keeps tagged ones: a guarded command that ran
    ``envvault gc --keep-last 0`` deleted the snapshot its rollback then could not find (helper 22, F4), and a
    gc on another node of a bucket vault saw no lock file of this one."""
    ids = {sid for text in vault.state.notes_of_held_locks(GUARD_LOCK) if (sid := read_guard_note(text)[1])}
    keys = vault.lock_objects()
    if keys is not None:
        from envvault.vault.lockobjects import live_leases

        ids.update(lease.snapshot for lease in live_leases(keys, clean=clean))
    return ids


def guard_lease(vault: Vault, sid: str, venv: str) -> AbstractContextManager[None]:
    """A running guard's lease on its "before" snapshot ``sid`` in a vault whose lock is lock objects
    (``lockobjects.lease``; docs/format.md, "Guard leases"); nothing to hold in a flock vault, whose lock file
    note every gc of it reads."""
    keys = vault.lock_objects()
    if keys is None:
        return nullcontext()
    from envvault.vault.lockobjects import lease

    return lease(keys, sid, venv)


def _choose(vault: Vault, keep_last: int | None, latests, guarded: set[str]) -> tuple[list, list]:
    snaps = vault.snapshots()  # newest first
    if keep_last is None:
        return snaps, []
    tagged = set(vault.tags().values()) | guarded
    groups: dict[tuple, list[str]] = {}  # (environment, kind, a system interpreter): its snapshots, newest first
    for s in snaps:
        who = s.snapshot.system_interpreter
        groups.setdefault((s.snapshot.venv, s.snapshot.kind, who), []).append(s.id)
    heads = latests() if latests is not None and keep_last > 0 else {}
    for venv, who in heads.keys() - {(venv, who) for venv, kind, who in groups if kind == "snapshot"}:
        groups[(venv, "snapshot", who)] = []  # restored onto (--into, another's snapshot), never snapped itself
    keep_ids = set(tagged)
    for (venv, kind, who), own in groups.items():
        head = heads.get((venv, who)) if kind == "snapshot" else None
        ordered = ([head] if head else []) + [sid for sid in own if sid != head]
        keep_ids.update(ordered[:keep_last])
    keep = [s for s in snaps if s.id in keep_ids]
    return keep, [s for s in snaps if s.id not in keep_ids]


@contextmanager
def _epoch_moved_at_the_end(vault: Vault, dry_run: bool) -> Iterator[None]:
    """Move ``gc-epoch`` on once more when the gc's work ends, however it ends (a failure after some deletions
    included): a process that read the vault while this gc ran (after its first move, ``forget_stat_caches``)
    forgets what it read before it writes (``Vault.lock``)."""
    try:
        yield
    finally:
        if not dry_run:
            vault.state.move_gc_epoch()


def collect_garbage(vault: Vault, *, keep_last: int | None = None, dry_run: bool = False,
                    latests=None) -> GcResult:
    """Keep tagged snapshots and, with ``keep_last``, the newest N of each environment (all when None; an
    environment's compile-cache snapshots and each system interpreter's apart); delete the rest and every
    object only they referenced. ``latests()``: ``{(environment, system interpreter or None): the snapshot
    latest names for it}`` (what it was last snapped as or restored to, whichever environment's snapshot that
    is), counted as its newest. The "before" snapshots of running guards stay as tagged ones do
    (``guarded_snapshots``)."""
    if keep_last is not None and keep_last < 0:
        raise EnvvaultError("--keep-last must be 0 or more", exit_code=2)
    with vault.lock(exclusive=True), _epoch_moved_at_the_end(vault, dry_run):
        guarded = guarded_snapshots(vault, clean=not dry_run) if keep_last is not None else set()
        keep, drop = _choose(vault, keep_last, latests, guarded)
        unreadable = set(vault.snapshot_ids()) - {s.id for s in keep} - {s.id for s in drop}
        if unreadable:
            # Their references are unknown; deleting anything could break them.
            first = min(unreadable)
            raise CorruptError(
                f"{len(unreadable)} snapshot(s) cannot be read ({', '.join(sorted(u[:12] for u in unreadable))}; "
                f"{vault.skipped.get(first, f'snapshot {first[:12]} vanished while read')}); "
                "gc stops so it cannot delete what they need; run `envvault verify`"
            )
        if keep_last is not None and vault.bad_tags:
            # A tag that cannot be read may name a snapshot --keep-last would drop.
            name, why = sorted(vault.bad_tags.items())[0]
            raise CorruptError(f"{why}; gc --keep-last stops so it cannot drop a tagged snapshot; fix or remove "
                               f"tags/{name}")
        problems: dict = {}
        live: set[str] = set()
        for s in keep:
            live |= referenced_objects(vault, s.snapshot, problems, s.id)
        if problems:
            raise CorruptError(
                f"{len(problems)} manifest(s) of kept snapshots cannot be read; gc stops so it cannot delete what "
                "they reference; run `envvault verify`"
            )
        if not dry_run:
            # Stat caches trust the chunk ids they hold without asking the index (envvault/snap.py): they
            # go before anything else does.
            vault.state.forget_stat_caches(running=True)  # a plain value again at the end
            crash_point("gc_caches_dropped")
            for s in drop:
                vault.delete_snapshot(s.id)
                crash_point("gc_snapshot_removed")
        removed_packs = rewritten = partial = removed_objects = 0
        freed = 0
        warnings: list[str] = []
        backend = vault.backend
        indexed: set[str] = set()
        for name in sorted(backend.list("index")):
            locs = read_index(backend, name)  # the one parser of an index file (envvault/vault/store.py)
            if locs is None:
                warnings.append(f"index {name}.idx is unreadable; its pack is kept (run `envvault verify`)")
                indexed.add(name)
                continue
            pack_id = name  # read_index checks that the file names its own pack
            indexed.add(pack_id)
            live_here = {oid for oid in locs if oid in live}
            try:
                pack_size = backend.stat("packs", pack_id).size
            except Missing:
                warnings.append(f"pack {pack_id[:12]} is missing; its index is removed")
                if not dry_run:
                    backend.remove("index", name)
                continue
            if not live_here:
                removed_packs += 1
                removed_objects += len(locs)
                freed += pack_size
                if not dry_run:
                    backend.remove("index", name)  # index first: a pack without index is ignored
                    crash_point("gc_index_removed")
                    backend.remove("packs", pack_id)
                continue
            total = sum(loc[4] for loc in locs.values())
            dead = sum(loc[4] for oid, loc in locs.items() if oid not in live_here)
            if dead == 0:
                continue
            if dead < REWRITE_DEAD_FRACTION * total:
                partial += 1
                continue
            rewritten += 1
            removed_objects += len(locs) - len(live_here)
            if dry_run:
                freed += int(pack_size * dead / max(total, 1))
                continue
            written = _rewrite(vault, pack_id, locs, live_here)
            crash_point("gc_rewritten")
            backend.remove("index", name)
            crash_point("gc_index_removed")
            backend.remove("packs", pack_id)
            freed += pack_size - written
        # Packs that never got an index (a writer killed between pack and index) are garbage; packs a
        # rewrite just made have theirs.
        indexed |= set(backend.list("index"))
        for pack_id in sorted(backend.list("packs")):
            if pack_id not in indexed:
                try:
                    freed += backend.stat("packs", pack_id).size
                except Missing:
                    continue
                removed_packs += 1
                if not dry_run:
                    backend.remove("packs", pack_id)
        if not dry_run:
            vault.clean_tmp(older_than=_TMP_AGE)
    return GcResult(dry_run, tuple(s.id for s in keep), tuple(s.id for s in drop), removed_packs, rewritten,
                    partial, removed_objects, freed, tuple(warnings),
                    tuple(sorted(guarded & {s.id for s in keep})))


def _rewrite(vault: Vault, pack_id: str, locs: dict, live: set[str]) -> int:
    """Copy ``live`` objects of one pack (``locs``: its index, ``read_index``) into new packs, in pack order;
    returns the compressed bytes written."""
    by_frame: dict[tuple, list] = {}
    for oid in live:
        _, fo, fl, off, length, kind = locs[oid]
        by_frame.setdefault((fo, fl), []).append((off, length, kind, oid))
    with pack_writing(vault) as writer:
        for fo, fl in sorted(by_frame):
            frame = read_frame(vault.backend, pack_id, fo, fl)
            for off, length, kind, oid in sorted(by_frame[(fo, fl)]):
                data = frame[off: off + length]
                if len(data) != length or object_id(data) != oid:
                    raise CorruptError(f"pack {pack_id}.pack is damaged; run `envvault verify --read-data` (gc stopped, nothing lost)")
                writer.add(oid, data, kind)
    return writer.written_bytes

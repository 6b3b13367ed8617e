"""The vault: objects in packs, snapshots, tags, locks. See docs/format.md.

Pack internals do not leak past this module: callers put and get objects by id.
"""

from __future__ import annotations

import json
import os
import re
import threading
import weakref
from contextlib import contextmanager
from envvault.model.records import dataclass
from functools import cached_property
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)

from envvault.errors import AmbiguousError, CorruptError, EnvvaultError, NotFoundError, UsageError
from envvault.model.encoding import MAX_DOC_BYTES, canonical_json, json_loads, object_id, parse_json
from envvault.vault.backend import Backend, Missing, ReadFailed
from envvault.vault.heads import newest_head
from envvault.vault.config import FORMAT, MAX_SMALL_DOC, check_config, open_local, read_config, write_config
from envvault.vault.local import VAULT_ENTRIES, LocalBackend
from envvault.vault.packs import PackWriter, read_frame
from envvault.vault.state import GC_RUNNING, LocalState
from envvault.vault.location import default_vault_path, vault_url
from envvault.model.snapshot import Snapshot, is_id, parse_snapshot, tag_name_problem

if TYPE_CHECKING:  # a manifest is parsed only where one is loaded: a cache snap or restore never imports it
    from typing import Callable, Iterable, Iterator
    from envvault.model.manifest import DistManifest

__all__ = ["Vault", "ObjectReader", "default_vault_path", "FORMAT", "SnapshotRef", "check_tag_name",
           "VAULT_ENTRIES", "MAX_TAG_BYTES", "MAX_SMALL_DOC", "index_locations", "read_index"]

_HEX = re.compile(r"^[0-9a-f]+$")
MAX_TAG_BYTES = 4096  # a tag file is one id and a newline


def check_tag_name(name: str) -> str:
    """``name`` when it is a valid tag name (docs/format.md, "Ids on the command line"), else a UsageError.
    Every path that touches ``tags/`` goes through it, so a name is never a path."""
    why = tag_name_problem(name)
    if why:
        raise UsageError(f"bad tag name {name!r}: {why}")
    return name


@dataclass(frozen=True)
class SnapshotRef:
    """A committed snapshot: its id and its parsed, validated document (``envvault.model.snapshot``)."""

    id: str
    snapshot: Snapshot

    @property
    def created(self) -> str:
        return self.snapshot.created

    @cached_property
    def doc(self) -> dict:
        """The document as a plain dict (``snapshot.to_dict()``, cached): for tests that forge documents; code reads
        ``snapshot``."""
        return self.snapshot.to_dict()


_MAX_LOCATION = 1 << 48  # no offset or length in a pack reaches this (256 TiB)


_HEX_DIGITS = b"0123456789abcdef"


def index_locations(doc, pack_name: str | None = None) -> dict[str, tuple]:
    """A pack's index file (docs/format.md, "Index files"), parsed: object id -> (pack_id, frame_offset,
    frame_length, offset, length, kind). A TypeError, ValueError, KeyError or IndexError when any part is
    not what envvault writes (an object id that is not 64 lowercase hex digits, a pack id that is not the file's
    name ``pack_name``, a frame or a location that is not two or four items, a number that is not a
    non-negative int, a frame index past the frames); the whole file then counts as damaged. Checked a
    column at a time, not an object at a time: a vault's index lists every object it holds, and commands
    that read objects load all of it (52,000 objects on a 7 GB venv)."""
    pack = doc["pack"]
    if not is_id(pack) or (pack_name is not None and pack != pack_name):
        raise TypeError("not this pack's id")
    frames, objects = doc["frames"], doc["objects"]
    if type(frames) is not list or type(objects) is not dict:
        raise TypeError("not an index")
    if objects and (set(map(len, objects)) != {64}
                    or "".join(objects).encode("ascii", "replace").translate(None, _HEX_DIGITS)):
        raise ValueError("an object id that is not 64 hex digits")
    f_off = [fo for fo, _ in frames]  # ValueError or TypeError: a frame that is not two items
    f_len = [fl for _, fl in frames]
    rows = [(oid, fi, off, length, kind) for oid, (fi, off, length, kind) in objects.items()]
    fis = [r[1] for r in rows]
    numbers = f_off + f_len + fis + [r[2] for r in rows] + [r[3] for r in rows]
    if numbers and (set(map(type, numbers)) != {int} or min(numbers) < 0):  # no bool, float or string
        raise TypeError("not a location")
    if numbers and max(numbers) >= _MAX_LOCATION:  # would overflow a read's offset (an internal error)
        raise ValueError("a location past any pack")
    if rows and set(map(type, [r[4] for r in rows])) != {str}:
        raise TypeError("an object kind that is not a string")
    if fis and max(fis) >= len(frames):
        raise IndexError("a frame index past the frames")
    return {oid: (pack, f_off[fi], f_len[fi], off, length, kind) for oid, fi, off, length, kind in rows}


def read_index(backend: Backend, name: str) -> dict[str, tuple] | None:
    """The locations index file ``name`` gives (``index_locations``), or None when it cannot be read or is
    damaged in any way: then none of its objects count (``verify`` reports it, gc keeps its pack)."""
    try:
        return index_locations(json_loads(backend.load("index", name, limit=MAX_DOC_BYTES)), name)
    except (EnvvaultError, ValueError, KeyError, TypeError, IndexError):
        return None


class Vault:
    """A vault: shared objects through ``backend`` (``backend.py``), machine-local files through ``state``
    (``state.py``). ``Vault.open(path, create=True)`` opens (or makes) a local one; ``Vault.from_backend``
    one on any backend. ``location`` names the vault in messages."""

    def __init__(self, backend: Backend, config: dict, state: LocalState):
        self.backend = backend
        self.state = state
        self.location = backend.location
        # The folder of a local vault (None on other backends); only envvault/vault/ and tests use it.
        self.root: Path | None = getattr(backend, "root", None)
        self.config = config
        self.level = int(config.get("zstd_level", 3))
        self.level_large = int(config.get("zstd_level_large", 2))
        self._index: dict[str, tuple] | None = None
        self._index_seen: set[str] = set()  # index files loaded (or found damaged)
        self._index_whole = False  # every index file listed has been loaded (``index``)
        self._index_unread: list[str] | None = None  # ``locate``: index files not loaded yet, the next first
        self._index_lock = threading.RLock()  # ``locate`` runs on a restore's threads
        self._reader: ObjectReader | None = None
        self.skipped: dict[str, str] = {}  # snapshot id -> why it could not be loaded
        # Snapshots this object committed, as committed: ``load_snapshot`` answers them without reading and
        # parsing their document again (a snap's verdict chose its baseline by reading the one it had just
        # written, twice).
        self._committed: dict[str, SnapshotRef] = {}
        self.bad_tags: dict[str, str] = {}  # entry in tags/ -> why it was not read
        # Where warnings about skipped documents go (the CLI prints them on stderr); default: nowhere.
        self.warn: Callable[[str], None] = lambda message: None
        # What a gc may make wrong (``_after_gc``): the epoch when this object first read the vault, the stat
        # caches it made.
        self._gc_epoch = state.read("gc-epoch", 4096)
        self._relisted_for: bytes | None = None  # the running ``gc-epoch`` the index was last listed again for
        self._stat_caches: weakref.WeakSet = weakref.WeakSet()

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike | None = None, *, create: bool = False) -> "Vault":
        url = vault_url(path or os.environ.get("ENVVAULT_HOME") or None)
        if url:  # H6: s3://BUCKET/PREFIX (envvault/vault/s3.py)
            from envvault.vault.s3 import open_vault

            return open_vault(cls, url, create=create)
        root = default_vault_path(path)
        backend = LocalBackend(root)
        return cls(backend, open_local(backend, create=create), LocalState.in_vault(root))

    @classmethod
    def from_backend(cls, backend: Backend, state: LocalState, *, create: bool = False) -> "Vault":
        """The vault on ``backend`` (made there when absent and ``create``), its machine-local files in ``state``."""
        try:
            backend.stat("config", "config")
            made = True
        except Missing:
            made = False
        if not made:
            if not create:
                raise NotFoundError(f"no vault at {backend.location}; run `envvault snap` first or pass --vault")
            write_config(backend)
        return cls(backend, check_config(backend, read_config(backend)), state)

    # -- locking -------------------------------------------------------------------------------
    @contextmanager
    def lock(self, exclusive: bool = False, *, wait: bool = True) -> Iterator[bool]:
        """The vault lock: shared for writers (snaps, restores), exclusive for gc. Blocks until granted; with
        ``wait=False`` yields False at once when it is busy. A local vault whose settings say ``lock =
        "objects"`` takes it as lock objects (``local_locks.py``), for a shared filesystem."""
        if wait:  # a lock someone else holds is said on stderr, not waited on in silence (a gc may take minutes)
            with self._lock(exclusive, False) as held:
                if held:
                    self._after_gc()
                    yield True
                    return
            self.note_waiting()
        with self._lock(exclusive, wait) as held:
            if held:
                self._after_gc()
            yield held

    def _after_gc(self) -> None:
        """Run as the vault lock is granted. When a gc ran since this object read the vault (``gc-epoch`` moved
        on: ``LocalState.move_gc_epoch``), what it read before may name objects that gc deleted: its index is
        listed again, the snapshots it committed are read again, and each stat cache it made forgets what it
        held (``StatCache.forget_if_gc_ran``). Without this a snap that waited for a gc committed a snapshot
        whose manifests that gc had deleted (its stat cache, loaded before the wait, trusted them)."""
        epoch = self.state.read("gc-epoch", 4096)
        # A running value under the lock: a gc killed part way, maybe while this object listed the index; the
        # index is listed again once for that value (what is listed under the lock, after that gc, is sound).
        killed = epoch is not None and epoch.rstrip().endswith(GC_RUNNING) and epoch != self._relisted_for
        if epoch != self._gc_epoch or killed:
            self._relisted_for = epoch
            self._gc_epoch = epoch
            with self._index_lock:
                self._index_whole, self._index, self._index_seen, self._index_unread = False, {}, set(), None
            self._committed = {}
        now = epoch.decode("ascii", "replace") if epoch is not None else ""  # as StatCache reads it
        for cache in list(self._stat_caches):
            cache.forget_if_gc_ran(now)

    def note_waiting(self) -> None:
        """Said on stderr by every command (the CLI's, guard's, the cache commands', a training process's
        stamp), not only those that print warnings: a wait in silence looks like a hang."""
        import sys

        try:
            sys.stderr.write("envvault: waiting for the vault lock, which another envvault command holds; "
                             "Ctrl-C stops waiting\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass  # no stderr to tell

    def _lock(self, exclusive: bool, wait: bool):
        keys = self.lock_objects()
        if keys is not None:
            from envvault.vault.lockobjects import hold

            return hold(keys, "vault", exclusive=exclusive, wait=wait)
        return self.backend.lock("vault", exclusive=exclusive, wait=wait)

    def lock_objects(self):
        """The ``lockobjects.LockKeys`` of a vault whose lock is lock objects (a bucket; a local vault whose
        settings say ``lock = "objects"``), else None (flock)."""
        if isinstance(self.backend, LocalBackend):
            if self._lock_setting() != "objects":
                return None
            from envvault.vault.local_locks import DirLockKeys

            return DirLockKeys(self.backend.root)
        return self.backend if hasattr(self.backend, "list_meta") else None

    # -- index ---------------------------------------------------------------------------------
    def index(self, refresh: bool = False) -> dict[str, tuple]:
        """Object id -> (pack_id, frame_offset, frame_length, offset, length, kind).

        Index files are listed once per Vault object (objects this process writes are added as their packs
        commit); ``refresh=True`` lists again to see what other processes wrote since. They are loaded in
        ``locate``'s order (the most recently written first, on a local vault), so an object held by two packs
        is read from the same one whichever way a command first looks; an index file that cannot be read is
        tried again on the next refresh.
        """
        if self._index_whole and not refresh:
            return self._index
        with self._index_lock:
            return self._index_all()

    def _index_all(self) -> dict[str, tuple]:
        if self._index is None:
            self._index = {}
        names = [n for n in self.backend.list("index") if n not in self._index_seen]
        order = getattr(self.backend, "newest_first", None)
        if order is not None:  # the order locate loads them in: an object in two packs is read from one
            names = order("index", names)
        prefetch = getattr(self.backend, "prefetch", None)  # a remote vault: fetch them side by side
        if prefetch is not None and len(names) > 1:
            prefetch("index", names)
        for name in names:
            self._load_index_file(name)
        self._index_whole = True
        self._index_unread = []
        return self._index

    def _load_index_file(self, name: str) -> None:
        found = read_index(self.backend, name)
        if found is None:  # damaged or not read this time: its objects absent, read again on a refresh
            return
        self._merge(name, found)

    def _merge(self, pack_id: str, found: dict) -> None:
        """Add one pack's locations to the index; an object already there (in two packs) keeps its first
        location. The pack counts as seen only once its objects are in."""
        idx = self._index
        if idx and not idx.keys().isdisjoint(found):
            found = {oid: loc for oid, loc in found.items() if oid not in idx}
        idx.update(found)
        self._index_seen.add(pack_id)

    def locate(self, oid: str, refresh: bool = True) -> tuple | None:
        """Where object ``oid`` lies (as ``index()[oid]``), or None when no index file lists it. Reads only
        as many index files as it needs, the most recently written first (a local vault: the objects of a new
        snapshot are in its newest packs; a restore of a compile cache reads one or two of a hundred index
        files); a miss after all of them lists the index again (another process may have written since). A
        backend that cannot tell which files are newest (a bucket) loads them all at once, side by side."""
        idx = self._index
        loc = idx.get(oid) if idx is not None else None
        if loc is not None:
            return loc
        order = getattr(self.backend, "newest_first", None)
        with self._index_lock:
            if order is None:  # a bucket: every index file fetched side by side beats one at a time
                return self.index().get(oid) or (self.index(refresh=True).get(oid) if refresh else None)
            if self._index is None:
                self._index = {}
            if self._index_unread is None:
                names = [n for n in self.backend.list("index") if n not in self._index_seen]
                self._index_unread = order("index", names)[::-1]  # popped from the end: newest first
            unread = self._index_unread
            loc = self._index.get(oid)
            while loc is None and unread:
                self._load_index_file(unread.pop())
                loc = self._index.get(oid)
            if loc is None and refresh:
                loc = self.index(refresh=True).get(oid)
        return loc

    def has(self, oid: str) -> bool:
        return oid in self.index()

    def prefetch(self, oids: Iterable[str]) -> None:
        """Say which objects will be read next, in about that order: a remote vault starts fetching their
        packs side by side (``S3Backend.prefetch``); a local one has nothing to do."""
        prefetch = getattr(self.backend, "prefetch", None)
        if prefetch is None:
            return
        index = self.index()
        packs: dict[str, int] = {}
        for oid in oids:
            loc = index.get(oid)
            if loc is not None:
                packs[loc[0]] = max(packs.get(loc[0], 0), loc[1] + loc[2])  # the pack is at least this long
        if packs:
            prefetch("packs", list(packs), packs)

    def _add_to_index(self, pack_id: str, locs: dict) -> None:
        with self._index_lock:
            self.index()
            self._merge(pack_id, locs)

    def writer(self, threads: int | None = None, on_commit=None) -> PackWriter:
        """A pack writer into this vault (packs staged in ``state.tmp_dir``, stored through the backend); each
        stored pack's objects join this object's index, or go to ``on_commit(pack_id, locations)`` instead
        (a first snap's groups of small files: ``add_packs`` later)."""
        return PackWriter(self.backend, self.state.tmp_dir, self.level, on_commit or self._add_to_index,
                          threads=threads, level_large=self.level_large)

    @property
    def local(self) -> bool:
        """A vault in a folder (not a bucket): packs are stored by a rename, from any process."""
        return isinstance(self.backend, LocalBackend)

    def add_packs(self, packs: Iterable[tuple[str, dict]]) -> None:
        """Add stored packs' objects (``(pack_id, {oid: location})``, as a writer's ``on_commit`` gets them) to
        this object's index, in that order: an object already there keeps its first location."""
        for pack_id, locs in packs:
            self._add_to_index(pack_id, locs)

    # -- reading objects -----------------------------------------------------------------------
    def get(self, oid: str) -> bytes:
        """One object's bytes, checked against its id (CorruptError when damaged or missing)."""
        if self._reader is None:
            self._reader = ObjectReader(self)
        return bytes(self._reader.get(oid))

    def load_manifest(self, oid: str) -> DistManifest:
        """A distribution manifest by id, parsed and validated (``parse_dist_manifest``): a RefusedError naming
        every unsafe path, a CorruptError every other problem."""
        from envvault.model.manifest import parse_dist_manifest

        return parse_dist_manifest(self.get_json(oid), f"manifest {oid[:12]}")

    def get_json(self, oid: str) -> dict:
        doc = parse_json(self.get(oid), f"manifest {oid[:12]}")
        if not isinstance(doc, dict):
            raise CorruptError(f"manifest {oid[:12]} is not a JSON object")
        if doc.get("format", 1) > FORMAT:
            raise UsageError(f"manifest {oid[:12]} has a newer format; upgrade envvault")
        return doc

    # -- snapshots -----------------------------------------------------------------------------
    def commit_snapshot(self, doc: dict | Snapshot) -> str:
        """Write the snapshot file: the single commit point. Returns its id."""
        data = doc.to_json() if isinstance(doc, Snapshot) else canonical_json(doc)
        sid = object_id(data)
        self.backend.save("snapshots", sid, data)
        if isinstance(doc, Snapshot):  # its document parses to ``doc`` (build_snapshot's record, canonical)
            self._committed[sid] = SnapshotRef(sid, doc)
        share = getattr(self.backend, "share_head", None)  # a bucket: other nodes list it from heads objects
        if share is not None and isinstance(doc, Snapshot):
            from envvault.model.heads import head_of

            try:
                share(sid, head_of(doc).to_dict())
            except Exception:  # noqa: BLE001 - an optimisation of listing: the snapshot is committed
                pass
        return sid

    def snapshot_ids(self) -> list[str]:
        return [n for n in self.backend.list("snapshots") if len(n) == 64 and _HEX.match(n)]

    def has_snapshot(self, sid: str) -> bool:
        """Whether a snapshot file ``sid`` exists (not whether it is readable)."""
        if not is_id(sid):
            return False
        try:
            self.backend.stat("snapshots", sid)
            return True
        except EnvvaultError:
            return False

    def snapshot_still_there(self, sid: str) -> None:
        """Called with the vault lock held by a command that chose snapshot ``sid`` before it took the lock (a
        restore, a tag): a gc it waited for may have deleted it. A NotFoundError saying so when it is gone,
        before anything is written (a restore made a bare venv of it, a tag named a deleted snapshot)."""
        try:
            self.backend.stat("snapshots", sid)
        except Missing:  # (a read that fails otherwise says so itself)
            raise NotFoundError(f"snapshot {sid[:12]} is gone: a gc deleted it while this command waited for the "
                                "vault lock; nothing was changed; see `envvault list`") from None

    def delete_snapshot(self, sid: str) -> bool:
        """Remove one snapshot file (its objects become garbage for gc); False when it was not there. The
        caller holds the exclusive vault lock, or removes only a snapshot it made itself."""
        if not is_id(sid):
            return False
        return self.backend.remove("snapshots", sid)

    def load_snapshot(self, sid: str, *, from_disk: bool = False) -> SnapshotRef:
        """A snapshot read (a regular file, at most 512 MiB), checked against its id and validated
        (``envvault.model.snapshot.parse_snapshot``): a CorruptError naming every problem, or a UsageError for a
        newer format. A snapshot this object committed is answered as committed while its file is there,
        unless ``from_disk`` (``verify``: the file itself is what is checked)."""
        mine = None if from_disk else self._committed.get(sid)
        if mine is not None and self.has_snapshot(sid):
            return mine
        what = f"snapshot {sid[:12]}"
        try:
            data = self.backend.load("snapshots", sid, limit=MAX_DOC_BYTES)
        except (Missing, ValueError):  # ValueError: not a name (a path)
            raise NotFoundError(f"snapshot {sid[:12]} not found in {self.location}") from None
        except ReadFailed as err:
            raise CorruptError(f"{what} cannot be read: {err.why}") from None
        if object_id(data) != sid:
            raise CorruptError(f"{what} does not match its id; run `envvault verify --read-data`")
        return SnapshotRef(sid, parse_snapshot(parse_json(data, what), what))

    def snapshots(self) -> list[SnapshotRef]:
        """All readable snapshots, newest first. Damaged or malformed ones are skipped with a warning (once per
        snapshot, through ``self.warn``); ``self.skipped`` maps their ids to why (verify names them)."""
        out = [ref for ref in map(self.load_listed, self.snapshot_ids()) if ref is not None]
        out.sort(key=lambda s: (s.created, s.id), reverse=True)
        return out

    def load_listed(self, sid: str) -> SnapshotRef | None:
        """A listed snapshot, or None: deleted since listed (gc, retention), or damaged or malformed, which is
        warned of once (``self.warn``) and kept in ``self.skipped``."""
        try:
            return self.load_snapshot(sid)
        except NotFoundError:
            return None
        except (CorruptError, UsageError) as err:
            if sid not in self.skipped:
                self.skipped[sid] = str(err)
                self.warn(f"skipped {err}")
            return None

    def command(self, *words: str) -> str:
        """``envvault WORDS`` as a message tells the user to run it on this vault (``location.command_for``:
        with ``--vault`` when a plain ``envvault`` would open another)."""
        from envvault.vault.location import command_for

        return command_for(self.location, *words)

    def resolve(self, ref: str, *, venv: str | None = None) -> str:
        """A full id from: full hex, unique prefix (>= 4), tag, or ``latest`` (optionally of one venv).

        ``latest`` is the newest environment snapshot: it skips the backups a restore takes, so ``restore
        latest`` never undoes a restore, and cache-only snapshots (``cache snap``; the cache commands have a
        ``latest`` of their own, the newest snapshot that holds caches).
        """
        ref = ref.strip()
        if ref == "latest":
            hit = newest_head(self, lambda h: h.trigger != "restore-backup" and h.kind == "snapshot"
                              and (venv is None or h.venv == venv))
            if hit is None:
                where = f" of {venv}" if venv else ""
                snap = self.command("snap", *(("--venv", venv) if venv else ()))
                raise NotFoundError(f"no snapshot{where} in {self.location}; run `{snap}` first")
            return hit[0]
        tag = self.tags().get(ref)
        if tag:
            return tag
        low = ref.lower()
        if not _HEX.match(low):
            raise NotFoundError(f"no snapshot or tag named {ref!r} in {self.location}; see `envvault list`")
        if len(low) < 4:
            raise UsageError(f"id prefix {ref!r} is too short; give at least 4 hex digits")
        matches = [sid for sid in self.snapshot_ids() if sid.startswith(low)]
        if not matches:
            raise NotFoundError(f"no snapshot {ref!r} in {self.location}; see `envvault list`")
        if len(matches) > 1:
            cands = ", ".join(sorted(m[:12] for m in matches))
            raise AmbiguousError(f"id prefix {ref!r} is ambiguous: {cands}; give more digits")
        return matches[0]

    # -- tags ----------------------------------------------------------------------------------
    def tags(self) -> dict[str, str]:
        """Tag name -> snapshot id. Entries that are not a valid name holding one id (read as a regular file
        of at most 4 KiB) are skipped with a warning and listed in ``self.bad_tags``."""
        out = {}
        for name in sorted(self.backend.list("tags")):
            if name.startswith("."):
                continue
            try:
                check_tag_name(name)
                text = self.backend.load("tags", name, limit=MAX_TAG_BYTES)
                sid = text.decode("ascii").strip()
                if not is_id(sid):
                    raise CorruptError(f"tag {name!r} does not hold a snapshot id")
            except Missing:
                continue
            except (ReadFailed, UnicodeDecodeError, UsageError, CorruptError) as err:
                if name not in self.bad_tags:
                    why = str(err) if isinstance(err, (UsageError, CorruptError)) else f"tag {name!r} cannot be read"
                    self.bad_tags[name] = why
                    self.warn(f"skipped tags/{name}: {why}")
                continue
            out[name] = sid
        return out

    def set_tag(self, name: str, sid: str) -> None:
        self.backend.save("tags", check_tag_name(name), (sid + "\n").encode())

    def remove_tag(self, name: str) -> None:
        if not self.backend.remove("tags", check_tag_name(name)):
            raise NotFoundError(f"no tag {name!r}; see `envvault list`")

    # -- settings (user settings, in the vault) ------------------------------------------------
    def _lock_setting(self) -> str:
        """settings.json ``lock``: "flock" (the default) or "objects"; anything else is a usage error."""
        settings = self.settings()
        value = settings.get("lock", "flock") if isinstance(settings, dict) else "flock"
        if value not in ("flock", "objects"):
            raise UsageError(f"{self.location}: settings.json lock must be \"flock\" or \"objects\", not {value!r}")
        return value

    def settings(self) -> dict:
        try:
            return json_loads(self.backend.load("config", "settings", limit=MAX_SMALL_DOC))
        except (EnvvaultError, ValueError):
            return {}

    def save_settings(self, settings: dict) -> None:
        self.backend.save("config", "settings", json.dumps(settings, indent=1).encode())

    # -- machine-local state (caches and markers outside the data model: ``self.state``) -------------
    def state_path(self, name: str) -> Path:
        return self.state.path(name)

    def stat_cache(self, name: str, *, fresh: bool = False):
        """The stat cache ``name`` (``stat-<key>``, ``stat-caches``), saved under the shared vault lock;
        ``fresh``: an empty one that replaces what is saved (``StatCache``)."""
        from envvault.vault.statcache import StatCache

        cache = StatCache(self.state.path(name), lock=lambda: self.lock(), tmp_dir=self.state.tmp_dir, fresh=fresh)
        self._stat_caches.add(cache)  # made to forget what it holds when a gc ran before the lock (``_after_gc``)
        return cache

    def clean_tmp(self, older_than: float = 3600) -> None:
        """Remove temp files left by killed writers (only old ones: a live writer may own new ones)."""
        self.state.clean_tmp(older_than)


class ObjectReader:
    """Objects by id for many threads: each object re-hashed before use, one decompressed frame cached per
    thread (restores read chunks in pack order, so most reads hit the cached frame)."""

    def __init__(self, vault: "Vault"):
        import threading

        self.vault = vault
        self._local = threading.local()

    def prefetch(self, oids: Iterable[str]) -> None:
        """``Vault.prefetch``: the objects about to be read, in order."""
        self.vault.prefetch(oids)

    def locate(self, oid: str, refresh: bool = True) -> tuple | None:
        """``Vault.locate``: where an object lies, or None."""
        return self.vault.locate(oid, refresh)

    def get(self, oid: str) -> memoryview:
        loc = self.vault.locate(oid)
        if loc is None:
            raise CorruptError(f"object {oid[:12]} is missing from the vault; run `envvault verify` (or, when a gc "
                               "ran meanwhile, this command again: readers take no lock)")
        pack, fo, fl, off, length, _kind = loc
        cached = getattr(self._local, "frame", None)
        if cached is not None and cached[0] == (pack, fo):
            frame = cached[1]
        else:
            frame = memoryview(read_frame(self.vault.backend, pack, fo, fl))
            self._local.frame = ((pack, fo), frame)
        data = frame[off : off + length]
        if len(data) != length:
            raise CorruptError(f"object {oid[:12]} lies beyond its frame in pack {pack[:12]}; run `envvault verify --read-data`")
        if object_id(data) != oid:
            raise CorruptError(f"object {oid[:12]} does not match its id (pack {pack[:12]}); run `envvault verify --read-data`")
        return data

"""The vault: objects in packs, snapshots, tags, locks. See docs/format.md.

Pack internals do not leak past this module: callers put and get objects by id.
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator

from envvault.errors import AmbiguousError, CorruptError, NotFoundError, StorageError, UsageError
from envvault.model.encoding import MAX_DOC_BYTES, canonical_json, object_id, parse_json
from envvault.vault.fsutil import atomic_write, flocked, link_refused, read_regular, storage_error
from envvault.vault.packs import PackWriter, read_frame
from envvault.vault.s3 import vault_url
from envvault.model.manifest import DistManifest, parse_dist_manifest
from envvault.model.snapshot import Snapshot, is_id, parse_snapshot, tag_name_problem

__all__ = ["Vault", "ObjectReader", "default_vault_path", "FORMAT", "SnapshotRef", "check_tag_name",
           "VAULT_ENTRIES", "MAX_TAG_BYTES", "MAX_SMALL_DOC"]

FORMAT = 1
_HEX = re.compile(r"^[0-9a-f]+$")
VAULT_DIRS = ("packs", "index", "snapshots", "tags", "locks", "state", "tmp")
# The vault's own top-level entries: the only names a folder may hold for envvault to make a vault in it.
VAULT_ENTRIES = frozenset(VAULT_DIRS) | {"config.json", "settings.json"}
MAX_TAG_BYTES = 4096  # a tag file is one id and a newline
MAX_SMALL_DOC = 1 << 20  # config.json, settings.json


def check_tag_name(name: str) -> str:
    """``name`` when it is a valid tag name (docs/format.md, "Ids on the command line"), else a UsageError.
    Every path that touches ``tags/`` goes through it, so a name is never a path."""
    why = tag_name_problem(name)
    if why:
        raise UsageError(f"bad tag name {name!r}: {why}")
    return name


def default_vault_path(explicit: str | os.PathLike | None = None) -> Path:
    url = vault_url(explicit or os.environ.get("ENVVAULT_HOME") or None)  # H6: a URL is never a local folder
    if url:
        raise UsageError(f"{url} is not a local folder")
    if explicit:
        return Path(explicit).expanduser().absolute()
    if os.environ.get("ENVVAULT_HOME"):
        return Path(os.environ["ENVVAULT_HOME"]).expanduser().absolute()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).expanduser().absolute() / "envvault"


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
        """TRANSITIONAL: the document as a dict (``snapshot.to_dict()``), for readers not yet on the record."""
        return self.snapshot.to_dict()


class Vault:
    """A vault directory. ``Vault.open(path, create=True)`` makes one if absent."""

    def __init__(self, root: Path, config: dict):
        self.root = root
        self.config = config
        self.level = int(config.get("zstd_level", 3))
        self.level_large = int(config.get("zstd_level_large", 2))
        self._index: dict[str, tuple] | None = None
        self._index_seen: set[str] = set()
        self._reader: ObjectReader | None = None
        self.skipped: dict[str, str] = {}  # snapshot id -> why it could not be loaded
        self.bad_tags: dict[str, str] = {}  # entry in tags/ -> why it was not read
        # Where warnings about skipped documents go (the CLI prints them on stderr); default: nowhere.
        self.warn: Callable[[str], None] = lambda message: None

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike | None = None, *, create: bool = False) -> "Vault":
        url = vault_url(path or os.environ.get("ENVVAULT_HOME") or None)
        if url:  # H6: s3://BUCKET/PREFIX (envvault/vault/s3.py)
            from envvault.vault.s3 import open_vault

            return open_vault(cls, url, create=create)
        root = default_vault_path(path)
        cfg_path = root / "config.json"
        if not os.path.lexists(cfg_path):
            if not create:
                raise NotFoundError(f"no vault at {root}; run `envvault snap` first or pass --vault PATH")
            cls._create(root)
        cls._check_links(root)
        try:
            config = parse_json(read_regular(cfg_path, MAX_SMALL_DOC, f"{cfg_path}"), f"{cfg_path}")
        except OSError as err:
            raise StorageError(f"cannot read {cfg_path}: {err.strerror}") from None
        except CorruptError:
            config = None
        if not isinstance(config, dict) or type(config.get("format")) is not int:
            if not (root / "snapshots").is_dir():  # another program's folder, not a damaged vault
                raise UsageError(f"{root} is not an envvault vault ({cfg_path} is not envvault's); pass --vault "
                                 "with a new or empty folder")
            raise CorruptError(f"{cfg_path} is not an envvault config; is --vault pointing at the right place?")
        if config["format"] > FORMAT:
            raise UsageError(
                f"this vault was written by a newer envvault (format {config['format']}, this one reads {FORMAT}); upgrade envvault"
            )
        return cls(root, config)

    @staticmethod
    def _check_links(root: Path) -> None:
        """Refuse a vault whose own entries (top-level files and folders, ``packs/<aa>/``) are symlinks: the
        root itself may be one, nothing inside it may (writes through it would land outside the vault)."""
        for name in sorted(VAULT_ENTRIES):
            if os.path.islink(root / name):
                raise link_refused(root / name)
        try:
            with os.scandir(root / "packs") as entries:
                for entry in entries:
                    if entry.is_symlink():
                        raise link_refused(entry.path)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as err:
            raise storage_error(err, root / "packs") from None

    @staticmethod
    def _create(root: Path) -> None:
        """Make a vault in a new or empty folder (or finish one a killed or concurrent creator began). Modes are
        set only on what this creates: an existing folder (a shared 1777 one) keeps its mode."""
        try:
            try:
                root.mkdir(mode=0o700, parents=True)
                os.chmod(root, 0o700)
            except FileExistsError:
                if not root.is_dir():
                    raise UsageError(f"{root} is not a folder; pass --vault with a new or empty folder") from None
                alien = sorted(set(os.listdir(root)) - VAULT_ENTRIES)
                if alien:
                    shown = ", ".join(alien[:3]) + (f" and {len(alien) - 3} more" if len(alien) > 3 else "")
                    raise UsageError(f"{root} is not empty and not an envvault vault (it holds {shown}); pass "
                                     "--vault with a new or empty folder") from None
            Vault._check_links(root)
            for sub in VAULT_DIRS:
                try:
                    (root / sub).mkdir(mode=0o700)
                except FileExistsError:
                    pass
        except OSError as err:
            raise storage_error(err, root) from None
        cfg = {
            "format": FORMAT,
            "vault_id": os.urandom(16).hex(),
            "created": _now(),
            "zstd_level": 3,
            "zstd_level_large": 2,
        }
        cfg_path = root / "config.json"
        if not cfg_path.exists():
            try:
                # O_EXCL via link semantics: two creators race, one config wins.
                tmp = root / "tmp" / f"config.{os.getpid()}.tmp"
                tmp.write_bytes(json.dumps(cfg, indent=1).encode())
                os.link(tmp, cfg_path)
                os.unlink(tmp)
            except FileExistsError:
                os.unlink(tmp)
            except OSError as err:
                raise storage_error(err, cfg_path) from None

    # -- locking -------------------------------------------------------------------------------
    @contextmanager
    def lock(self, exclusive: bool = False) -> Iterator[None]:
        """Shared for writers (snaps), exclusive for gc. Blocks until granted."""
        with flocked(self.root / "locks" / "vault.lock", exclusive=exclusive, where=self.root):
            yield

    # -- index ---------------------------------------------------------------------------------
    def index(self, refresh: bool = False) -> dict[str, tuple]:
        """Object id -> (pack_id, frame_offset, frame_length, offset, length, kind).

        Index files are listed once per Vault object (objects this process writes are added as their packs
        commit); ``refresh=True`` lists again to see what other processes wrote since.
        """
        if self._index is not None and not refresh:
            return self._index
        if self._index is None:
            self._index = {}
        idx_dir = self.root / "index"
        try:
            names = os.listdir(idx_dir)
        except FileNotFoundError:
            names = []
        for name in names:
            if not name.endswith(".idx") or name in self._index_seen:
                continue
            try:
                doc = json.loads(read_regular(idx_dir / name, MAX_DOC_BYTES, f"index {name}"))
                pack = doc["pack"]
                frames = doc["frames"]
                for oid, (fi, off, length, kind) in doc["objects"].items():
                    fo, fl = frames[fi]
                    if not all(type(n) is int and n >= 0 for n in (fi, off, length, fo, fl)):
                        raise TypeError("not a location")
                    self._index.setdefault(oid, (pack, fo, fl, off, length, kind))
            except (OSError, ValueError, KeyError, TypeError, IndexError, CorruptError):
                # A damaged index is reported by verify; its objects are treated as absent.
                continue
            self._index_seen.add(name)
        return self._index

    def has(self, oid: str) -> bool:
        return oid in self.index()

    def _add_to_index(self, pack_id: str, locs: dict) -> None:
        idx = self.index()
        for oid, loc in locs.items():
            idx.setdefault(oid, loc)
        self._index_seen.add(f"{pack_id}.idx")

    def writer(self, threads: int | None = None) -> PackWriter:
        return PackWriter(self.root, self.level, self._add_to_index, threads=threads, level_large=self.level_large)

    def pack_path(self, pack_id: str) -> Path:
        return self.root / "packs" / pack_id[:2] / f"{pack_id}.pack"

    # -- reading objects -----------------------------------------------------------------------
    def get(self, oid: str) -> bytes:
        """One object's bytes, checked against its id (CorruptError when damaged or missing)."""
        if self._reader is None:
            self._reader = ObjectReader(self)
        return bytes(self._reader.get(oid))

    def load_manifest(self, oid: str) -> DistManifest:
        """A distribution manifest by id, parsed and validated (``parse_dist_manifest``): a RefusedError naming
        every unsafe path, a CorruptError every other problem."""
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
        atomic_write(self.root / "snapshots" / f"{sid}.json", data, tmp_dir=self.root / "tmp", mode=0o600)
        return sid

    def snapshot_ids(self) -> list[str]:
        try:
            names = os.listdir(self.root / "snapshots")
        except FileNotFoundError:
            return []
        return [n[:-5] for n in names if n.endswith(".json") and _HEX.match(n[:-5]) and len(n) == 69]

    def load_snapshot(self, sid: str) -> SnapshotRef:
        """A snapshot read (a regular file, at most 512 MiB), checked against its id and validated
        (``envvault.model.snapshot.parse_snapshot``): a CorruptError naming every problem, or a UsageError for a
        newer format."""
        what = f"snapshot {sid[:12]}"
        path = self.root / "snapshots" / f"{sid}.json"
        try:
            data = read_regular(path, MAX_DOC_BYTES, what)
        except FileNotFoundError:
            raise NotFoundError(f"snapshot {sid[:12]} not found in {self.root}") from None
        except OSError as err:
            raise CorruptError(f"{what} cannot be read: {err.strerror or err}") from None
        if object_id(data) != sid:
            raise CorruptError(f"{what} does not match its id; run `envvault verify`")
        return SnapshotRef(sid, parse_snapshot(parse_json(data, what), what))

    def snapshots(self) -> list[SnapshotRef]:
        """All readable snapshots, newest first. Damaged or malformed ones are skipped with a warning (once per
        snapshot, through ``self.warn``); ``self.skipped`` maps their ids to why (verify names them)."""
        out = []
        for sid in self.snapshot_ids():
            try:
                out.append(self.load_snapshot(sid))
            except (CorruptError, UsageError, NotFoundError) as err:
                if isinstance(err, NotFoundError):  # deleted since listed (gc, retention)
                    continue
                if sid not in self.skipped:
                    self.skipped[sid] = str(err)
                    self.warn(f"skipped {err}")
        out.sort(key=lambda s: (s.created, s.id), reverse=True)
        return out

    def resolve(self, ref: str, *, venv: str | None = None) -> str:
        """A full id from: full hex, unique prefix (>= 4), tag, or ``latest`` (optionally of one venv).

        ``latest`` skips the backups a restore takes, so ``restore latest`` never undoes a restore.
        """
        ref = ref.strip()
        if ref == "latest":
            snaps = [s for s in self.snapshots() if s.snapshot.trigger != "restore-backup"]
            if venv is not None:
                snaps = [s for s in snaps if s.snapshot.venv == venv]
            if not snaps:
                where = f" of {venv}" if venv else ""
                raise NotFoundError(f"no snapshot{where} in {self.root}; run `envvault snap` first")
            return snaps[0].id
        tag = self.tags().get(ref)
        if tag:
            return tag
        low = ref.lower()
        if not _HEX.match(low):
            raise NotFoundError(f"no snapshot or tag named {ref!r} in {self.root}; see `envvault list`")
        if len(low) < 4:
            raise UsageError(f"id prefix {ref!r} is too short; give at least 4 hex digits")
        matches = [sid for sid in self.snapshot_ids() if sid.startswith(low)]
        if not matches:
            raise NotFoundError(f"no snapshot {ref!r} in {self.root}; see `envvault list`")
        if len(matches) > 1:
            cands = ", ".join(sorted(m[:12] for m in matches))
            raise AmbiguousError(f"id prefix {ref!r} is ambiguous: {cands}; give more digits")
        return matches[0]

    # -- tags ----------------------------------------------------------------------------------
    def tags(self) -> dict[str, str]:
        """Tag name -> snapshot id. Entries that are not a valid name holding one id (read as a regular file
        of at most 4 KiB) are skipped with a warning and listed in ``self.bad_tags``."""
        out = {}
        try:
            names = os.listdir(self.root / "tags")
        except FileNotFoundError:
            return out
        for name in sorted(names):
            if name.startswith("."):
                continue
            try:
                check_tag_name(name)
                text = read_regular(self.root / "tags" / name, MAX_TAG_BYTES, f"tag {name!r}")
                sid = text.decode("ascii").strip()
                if not is_id(sid):
                    raise CorruptError(f"tag {name!r} does not hold a snapshot id")
            except FileNotFoundError:
                continue
            except (OSError, UnicodeDecodeError, UsageError, CorruptError) as err:
                if name not in self.bad_tags:
                    why = str(err) if isinstance(err, (UsageError, CorruptError)) else f"tag {name!r} cannot be read"
                    self.bad_tags[name] = why
                    self.warn(f"skipped tags/{name}: {why}")
                continue
            out[name] = sid
        return out

    def set_tag(self, name: str, sid: str) -> None:
        atomic_write(self.root / "tags" / check_tag_name(name), (sid + "\n").encode(), tmp_dir=self.root / "tmp")

    def remove_tag(self, name: str) -> None:
        try:
            os.unlink(self.root / "tags" / check_tag_name(name))
        except FileNotFoundError:
            raise NotFoundError(f"no tag {name!r}; see `envvault list`") from None

    # -- state (caches outside the data model) -------------------------------------------------
    def state_path(self, name: str) -> Path:
        return self.root / "state" / name

    def settings(self) -> dict:
        try:
            return json.loads(read_regular(self.root / "settings.json", MAX_SMALL_DOC, "settings.json"))
        except (OSError, ValueError, CorruptError):
            return {}

    def save_settings(self, settings: dict) -> None:
        atomic_write(self.root / "settings.json", json.dumps(settings, indent=1).encode(), tmp_dir=self.root / "tmp")

    def clean_tmp(self, older_than: float = 3600) -> None:
        """Remove temp files left by killed writers (only old ones: a live writer may own new ones)."""
        now = time.time()
        try:
            for entry in os.scandir(self.root / "tmp"):
                try:
                    st = entry.stat(follow_symlinks=False)
                    if not entry.is_dir(follow_symlinks=False) and now - st.st_mtime > older_than:
                        os.unlink(entry.path)  # a symlink is removed itself, never what it points to
                except OSError:
                    pass
        except OSError:
            pass


class ObjectReader:
    """Objects by id for many threads: each object re-hashed before use, one decompressed frame cached per
    thread (restores read chunks in pack order, so most reads hit the cached frame)."""

    def __init__(self, vault: "Vault"):
        import threading

        self.vault = vault
        self.index = vault.index()
        self._local = threading.local()

    def get(self, oid: str) -> memoryview:
        loc = self.index.get(oid) or self.vault.index(refresh=True).get(oid)
        if loc is None:
            raise CorruptError(f"object {oid[:12]} is missing from the vault; run `envvault verify`")
        pack, fo, fl, off, length, _kind = loc
        cached = getattr(self._local, "frame", None)
        if cached is not None and cached[0] == (pack, fo):
            frame = cached[1]
        else:
            frame = memoryview(read_frame(self.vault.pack_path(pack), fo, fl))
            self._local.frame = ((pack, fo), frame)
        data = frame[off : off + length]
        if len(data) != length:
            raise CorruptError(f"object {oid[:12]} lies beyond its frame in pack {pack[:12]}; run `envvault verify`")
        if object_id(data) != oid:
            raise CorruptError(f"object {oid[:12]} does not match its id (pack {pack[:12]}); run `envvault verify`")
        return data


def _now() -> str:
    now = time.time()  # one clock read: seconds and microseconds must agree
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1e6) % 1000000:06d}Z"

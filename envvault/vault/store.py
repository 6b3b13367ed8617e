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
from pathlib import Path
from typing import Iterator

from envvault.errors import AmbiguousError, CorruptError, NotFoundError, StorageError, UsageError
from envvault.model.encoding import canonical_json, object_id, parse_json
from envvault.vault.fsutil import atomic_write, flocked, storage_error
from envvault.vault.packs import PackWriter, read_frame

__all__ = ["Vault", "ObjectReader", "default_vault_path", "FORMAT", "SnapshotRef"]

FORMAT = 1
_HEX = re.compile(r"^[0-9a-f]+$")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def default_vault_path(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser().absolute()
    if os.environ.get("ENVVAULT_HOME"):
        return Path(os.environ["ENVVAULT_HOME"]).expanduser().absolute()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).expanduser().absolute() / "envvault"


@dataclass(frozen=True)
class SnapshotRef:
    """A committed snapshot: its id and its parsed document."""

    id: str
    doc: dict

    @property
    def created(self) -> str:
        return self.doc.get("created", "")


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

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike | None = None, *, create: bool = False) -> "Vault":
        root = default_vault_path(path)
        cfg_path = root / "config.json"
        if not cfg_path.exists():
            if not create:
                raise NotFoundError(f"no vault at {root}; run `envvault snap` first or pass --vault PATH")
            cls._create(root)
        try:
            config = parse_json(cfg_path.read_bytes(), f"{cfg_path}")
        except OSError as err:
            raise StorageError(f"cannot read {cfg_path}: {err.strerror}") from None
        if not isinstance(config, dict) or not isinstance(config.get("format"), int):
            raise CorruptError(f"{cfg_path} is not an envvault config; is --vault pointing at the right place?")
        if config["format"] > FORMAT:
            raise UsageError(
                f"this vault was written by a newer envvault (format {config['format']}, this one reads {FORMAT}); upgrade envvault"
            )
        return cls(root, config)

    @staticmethod
    def _create(root: Path) -> None:
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(root, 0o700)
            for sub in ("packs", "index", "snapshots", "tags", "locks", "state", "tmp"):
                (root / sub).mkdir(mode=0o700, exist_ok=True)
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
                doc = json.loads((idx_dir / name).read_bytes())
                pack = doc["pack"]
                frames = doc["frames"]
                for oid, (fi, off, length, kind) in doc["objects"].items():
                    fo, fl = frames[fi]
                    self._index.setdefault(oid, (pack, fo, fl, off, length, kind))
            except (OSError, ValueError, KeyError, TypeError, IndexError):
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

    def get_json(self, oid: str) -> dict:
        doc = parse_json(self.get(oid), f"manifest {oid[:12]}")
        if not isinstance(doc, dict):
            raise CorruptError(f"manifest {oid[:12]} is not a JSON object")
        if doc.get("format", 1) > FORMAT:
            raise UsageError(f"manifest {oid[:12]} has a newer format; upgrade envvault")
        return doc

    # -- snapshots -----------------------------------------------------------------------------
    def commit_snapshot(self, doc: dict) -> str:
        """Write the snapshot file: the single commit point. Returns its id."""
        data = canonical_json(doc)
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
        path = self.root / "snapshots" / f"{sid}.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"snapshot {sid[:12]} not found in {self.root}") from None
        if object_id(data) != sid:
            raise CorruptError(f"snapshot {sid[:12]} does not match its id; run `envvault verify`")
        doc = parse_json(data, f"snapshot {sid[:12]}")
        if not isinstance(doc, dict):
            raise CorruptError(f"snapshot {sid[:12]} is not a JSON object")
        if doc.get("format", 0) > FORMAT:
            raise UsageError(f"snapshot {sid[:12]} was written by a newer envvault; upgrade envvault")
        return SnapshotRef(sid, doc)

    def snapshots(self) -> list[SnapshotRef]:
        """All readable snapshots, newest first. Damaged ones are skipped (verify reports them)."""
        out = []
        for sid in self.snapshot_ids():
            try:
                out.append(self.load_snapshot(sid))
            except (CorruptError, UsageError):
                continue
        out.sort(key=lambda s: (s.created, s.id), reverse=True)
        return out

    def resolve(self, ref: str, *, venv: str | None = None) -> str:
        """A full id from: full hex, unique prefix (>= 4), tag, or ``latest`` (optionally of one venv).

        ``latest`` skips the backups a restore takes, so ``restore latest`` never undoes a restore.
        """
        ref = ref.strip()
        if ref == "latest":
            snaps = [s for s in self.snapshots() if s.doc.get("trigger") != "restore-backup"]
            if venv is not None:
                snaps = [s for s in snaps if s.doc.get("venv") == venv]
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
        out = {}
        try:
            names = os.listdir(self.root / "tags")
        except FileNotFoundError:
            return out
        for name in names:
            if name.startswith("."):
                continue
            try:
                sid = (self.root / "tags" / name).read_text().strip()
            except OSError:
                continue
            if _HEX.match(sid):
                out[name] = sid
        return out

    def set_tag(self, name: str, sid: str) -> None:
        if not _TAG.match(name) or name == "latest" or _HEX.match(name):
            raise UsageError(f"bad tag name {name!r}: use letters, digits, . _ -; not 'latest' and not all hex digits")
        atomic_write(self.root / "tags" / name, (sid + "\n").encode(), tmp_dir=self.root / "tmp")

    def remove_tag(self, name: str) -> None:
        try:
            os.unlink(self.root / "tags" / name)
        except FileNotFoundError:
            raise NotFoundError(f"no tag {name!r}; see `envvault list`") from None

    # -- state (caches outside the data model) -------------------------------------------------
    def state_path(self, name: str) -> Path:
        return self.root / "state" / name

    def settings(self) -> dict:
        try:
            return json.loads((self.root / "settings.json").read_bytes())
        except (OSError, ValueError):
            return {}

    def save_settings(self, settings: dict) -> None:
        atomic_write(self.root / "settings.json", json.dumps(settings, indent=1).encode(), tmp_dir=self.root / "tmp")

    def clean_tmp(self, older_than: float = 3600) -> None:
        """Remove temp files left by killed writers (only old ones: a live writer may own new ones)."""
        now = time.time()
        try:
            for entry in os.scandir(self.root / "tmp"):
                try:
                    if now - entry.stat().st_mtime > older_than:
                        os.unlink(entry.path)
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

"""``envvault sync SRC DST``: copy what one vault holds that another lacks (docs/format.md, "Object storage").

Content-addressed and incremental: names are compared, only missing objects travel, each checked against its
name where the name is its hash (packs, snapshots). The write order of a snap is kept (a pack, then its index
file; snapshot documents after every pack; tags last), so a sync cut off at any point leaves the destination
valid, only with unreferenced packs. Both vaults are held under their shared lock (a gc on either waits).
Tags of SRC are set on DST (a tag of the same name there is moved); DST keeps its own ``config.json``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from envvault.model.records import dataclass, field
from typing import Callable

from envvault.errors import CorruptError, EnvvaultError
from envvault.model.encoding import MAX_DOC_BYTES, object_id
from envvault.vault.store import Vault

__all__ = ["SyncResult", "sync_vaults"]

_PACK_LIMIT = 1 << 30  # a pack writer closes packs at about 32 MiB (plus one frame): a larger one is refused
_STEP = 8 << 20  # packs are copied this much at a time: four copying threads hold at most 32 MiB


@dataclass
class SyncResult:
    src: str
    dst: str
    dry_run: bool
    packs: int = 0
    pack_bytes: int = 0
    index_files: int = 0
    snapshots: int = 0
    tags: int = 0
    already: int = 0  # snapshots DST held already
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"src": self.src, "dst": self.dst, "dry_run": self.dry_run, "packs": self.packs,
                "pack_bytes": self.pack_bytes, "index_files": self.index_files, "snapshots": self.snapshots,
                "tags": self.tags, "snapshots_already_there": self.already, "warnings": self.warnings}


def sync_vaults(src: Vault, dst: Vault | None, *, dry_run: bool = False, threads: int = 4,
                progress: Callable[[str], None] | None = None, dst_location: str = "") -> SyncResult:
    """Copy into ``dst`` what ``src`` holds that it lacks. ``dst`` None (a dry run to a vault not made yet):
    everything would be copied."""
    if dst is None:
        if not dry_run:
            raise ValueError("dst is None outside a dry run")
        from envvault.vault.memory import MemoryBackend
        from envvault.vault.state import LocalState

        scratch = tempfile.gettempdir()
        dst = Vault.from_backend(MemoryBackend(dst_location), LocalState(Path(scratch), Path(scratch), Path(scratch)),
                                 create=True)
    if src.location == dst.location:
        raise EnvvaultError(f"sync: source and destination are the same vault ({src.location})", exit_code=2)
    result = SyncResult(src.location, dst.location, dry_run)
    note = progress or (lambda message: None)
    with src.lock(exclusive=False), dst.lock(exclusive=False):
        sb, db = src.backend, dst.backend
        src_index = set(sb.list("index"))
        src_packs = set(sb.list("packs"))
        have_packs = set(db.list("packs"))
        have_index = set(db.list("index"))
        # A pack without an index file is a killed writer's garbage: not copied.
        packs = sorted((src_packs & src_index) - have_packs)
        indexes = sorted(src_index & (have_packs | set(packs)) - have_index)
        src_snaps = set(sb.list("snapshots"))
        have_snaps = set(db.list("snapshots"))
        snaps = sorted(src_snaps - have_snaps)
        result.already = len(src_snaps & have_snaps)
        if dry_run:
            result.packs = len(packs)
            result.pack_bytes = sum(sb.stat("packs", p).size for p in packs)
            result.index_files = len(indexes)
            result.snapshots = len(snaps)
            result.tags = sum(1 for name, sid in src.tags().items() if dst.tags().get(name) != sid)
            return result
        tmp_dir = dst.state.tmp_dir
        tmp_dir.mkdir(parents=True, exist_ok=True)

        def copy_pack(pid: str) -> int:
            import blake3

            size = sb.stat("packs", pid).size
            if size > _PACK_LIMIT:
                raise CorruptError(f"{sb.where('packs', pid)} is {size} bytes, larger than any pack envvault "
                                   f"writes; run `envvault verify` on {src.location}")
            h = blake3.blake3()
            fd, tmp = tempfile.mkstemp(prefix=f".sync-{pid[:12]}.", suffix=".tmp", dir=tmp_dir)
            try:
                with os.fdopen(fd, "wb") as out:
                    done = 0
                    while done < size:
                        data = sb.load("packs", pid, done, min(_STEP, size - done))
                        if not data:
                            break
                        h.update(data)
                        out.write(data)
                        done += len(data)
                    out.flush()
                    os.fsync(out.fileno())
                if done != size or h.hexdigest() != pid:
                    raise CorruptError(f"{sb.where('packs', pid)} does not match its name; run `envvault verify --read-data` "
                                       f"on {src.location}")
                db.save_file("packs", pid, Path(tmp))
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return size

        def copy_index(pid: str) -> None:
            db.save("index", pid, sb.load("index", pid, limit=MAX_DOC_BYTES), exclusive=True)

        done = 0
        with ThreadPoolExecutor(max(1, threads)) as pool:
            for size in pool.map(copy_pack, packs):
                done += 1
                result.pack_bytes += size
                note(f"packs {done}/{len(packs)}")
            result.packs = done
            for _ in pool.map(copy_index, indexes):
                result.index_files += 1
        for sid in snaps:  # the commit points, after every pack and index file
            data = sb.load("snapshots", sid, limit=MAX_DOC_BYTES)
            if object_id(data) != sid:
                result.warnings.append(f"snapshot {sid[:12]} does not match its id; not copied (run `envvault "
                                       f"verify` on {src.location})")
                continue
            db.save("snapshots", sid, data, exclusive=True)
            result.snapshots += 1
        theirs = dst.tags()
        for name, sid in sorted(src.tags().items()):
            if theirs.get(name) != sid:
                dst.set_tag(name, sid)
                result.tags += 1
        for name, why in sorted(src.bad_tags.items()):
            result.warnings.append(f"tag {name!r} of {src.location} not copied: {why}")
    return result

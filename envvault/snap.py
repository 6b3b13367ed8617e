"""Taking a snapshot: scan the environment, store what is new, commit the snapshot document last."""

from __future__ import annotations

import os
import stat as statmod
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable


from envvault import __version__
from envvault.crashpoints import crash_point
from envvault.env.host import host_facts, relevant_env
from envvault.env.probe import Interpreter
from envvault.env.reader import reader_for
from envvault.errors import EnvironmentProblem
from envvault.model.encoding import canonical_json, object_id
from envvault.model.identity import (
    IDENTITY_VERSION,
    LAUNCHER_HEAD,
    fingerprint,  # noqa: F401 - re-exported: stamps and diff ask snap for it
    is_bytecode,
    is_generated,
    is_script,
    script_digest,
    scripts_id,
    state_id,
)
from envvault.vault.ingest import Ingester, StatCache, stat_key
from envvault.vault.store import FORMAT, Vault, _now

if TYPE_CHECKING:
    from envvault.env.dists import InstalledDist

__all__ = ["take_snapshot", "SnapResult", "scan_environment", "statcache_for", "fingerprint"]

CacheHook = Callable[[Vault, Ingester, StatCache], "list[dict]"]


@dataclass(frozen=True)
class SnapResult:
    id: str
    doc: dict

    def to_json(self) -> dict:
        d = self.doc
        return {
            "id": self.id,
            "short_id": self.id[:12],
            "created": d["created"],
            "message": d["message"],
            "venv": d["venv"],
            "packages": len(d["packages"]),
            "files": d["stats"]["files"],
            "bytes": d["stats"]["bytes"],
            "new_bytes": d["stats"]["new_bytes"],
            "new_objects": d["stats"]["new_objects"],
            "lock_only": d["lock_only"],
            "fingerprint": d["fingerprint"],
            "warnings": d["warnings"],
        }


def statcache_for(vault: Vault, target: Path) -> StatCache:
    from envvault.safepaths import env_key

    return StatCache(vault.state_path(f"stat-{env_key(target)}"))


# A python script bigger than this is hashed as it is (its shebang left in): none such is known.
_SCRIPT_READ_LIMIT = 16 << 20


class _Builder:
    """Builds distribution manifests for one snap."""

    def __init__(self, vault: Vault, interp: Interpreter, ingester: Ingester, cache: StatCache, mode: str):
        self.vault = vault
        self.interp = interp
        self.prefix = interp.prefix
        self._base = f"{interp.prefix}/"
        self.ing = ingester
        self.cache = cache
        self.mode = mode  # "full": hash and store; "check": hash only; "lock": RECORD only
        self.warnings: list[str] = []

    def file_entry(self, dist: InstalledDist, rec) -> dict | None:
        absolute = os.path.normpath(f"{dist.site}/{rec.path}")
        if not absolute.startswith(self._base):
            self.warnings.append(f"{dist.display}: {rec.path} lies outside the environment; not stored")
            return None
        rel = absolute[len(self._base):]
        entry = {"path": rel, "record": rec.path}
        if rec.digest is not None:
            entry["sha256" if rec.algo == "sha256" else f"record_{rec.algo}"] = rec.digest
        if rec.size is not None:
            entry["size"] = rec.size
        if is_bytecode(rec.path):
            entry["state"] = "ok"
            return entry
        if self.mode == "lock":
            entry["state"] = "unchecked"
            return entry
        try:
            st = os.lstat(absolute)
        except FileNotFoundError:
            entry["state"] = "missing"
            return entry
        except OSError as err:
            raise EnvironmentProblem(f"cannot stat {absolute}: {err.strerror}") from None
        if statmod.S_ISDIR(st.st_mode):
            return None  # virtualenv's seeder lists folders; manifest() reports them
        entry["mode"] = st.st_mode & 0o7777
        if statmod.S_ISLNK(st.st_mode):
            entry["link"] = os.readlink(absolute)
            entry["state"] = "ok"
            return entry
        hit = self.cache.lookup(rel, st)
        if hit is not None and (self.mode == "check" or hit[2] is not None):
            sha, chunks = hit[1], hit[2]
        else:
            fd = self.ing.ingest(absolute, st.st_size)
            sha, chunks = fd.sha256, fd.chunks
            self.cache.put(rel, st, sha, chunks)
        if self.mode == "full":
            entry["chunks"] = chunks
        entry["size"] = st.st_size
        if rec.algo == "sha256" and rec.digest is not None:
            if sha != rec.digest:
                entry["state"] = "modified"
                entry["record_sha256"] = rec.digest
                entry["sha256"] = sha
            else:
                entry["state"] = "ok"
        else:
            entry["state"] = "unhashed"
            entry["sha256"] = sha
        return entry

    def manifest(self, dist: InstalledDist) -> dict:
        files = []
        modified = []
        layout = dist.layout(self.interp.scripts)
        folders, unhashed, scripts = [], [], []
        scripts_known = self.mode != "lock"
        for rec in dist.record or ():
            entry = self.file_entry(dist, rec)
            if entry is None:
                if os.path.isdir(os.path.normpath(f"{dist.site}/{rec.path}")):
                    folders.append(rec.path)
                continue
            files.append(entry)
            if entry["state"] == "modified":
                modified.append((entry["path"], entry["sha256"]))
            generated = is_generated(rec, layout)
            script = is_script(rec.path, layout) and not generated
            if generated and is_script(rec.path, layout):
                entry["generated"] = True  # a launcher named in entry_points.txt
            digest = None
            if script and self.mode != "lock":
                digest = self._script(entry, layout, rec)
                if digest == "":
                    entry["generated"] = True  # a launcher by its content
                elif digest is None:
                    scripts_known = False  # an edited or missing script: its build cannot be told
                elif digest:
                    scripts.append((os.path.basename(rec.path), digest))
            if rec.algo is None and not generated and (digest or not script):  # launchers are the installer's
                unhashed.append(rec.path)
        self._report_rows(dist, folders, unhashed, [f["record"] for f in files if f["state"] == "missing"])
        build = dist.build_id(self.interp.scripts)
        from envvault.env.dists import build_info  # email, packaging: the fast path never needs them

        return {
            "kind": "dist",
            "format": FORMAT,
            "name": dist.name,
            "version": dist.version,
            "dist_info": dist.dist_info.relative_to(self.prefix).as_posix(),
            "installer": dist.installer,
            "requested": dist.requested,
            "wheel": dist.wheel,
            "direct_url": dist.direct_url,
            "record": "ok" if dist.record is not None else "missing",
            "build_id": build,
            "state_id": state_id(build, modified),
            "scripts": scripts_id(scripts) if scripts_known else None,
            "build_info": build_info(dist),
            "files": files,
        }

    def _script(self, entry: dict, layout, rec) -> str | None:
        """The normalised digest of a script in the scripts folder; "" for a launcher the installer wrote
        (generated, by its content); None when the script is edited or missing."""
        if entry["state"] not in ("ok", "unhashed") or "link" in entry:
            return None
        absolute = f"{self._base}{entry['path']}"
        try:
            with open(absolute, "rb") as fh:
                head = fh.read(LAUNCHER_HEAD)
                if is_generated(rec, layout, head):
                    return ""
                if not head.startswith(b"#!") or entry.get("size", 0) > _SCRIPT_READ_LIMIT:
                    return entry["sha256"]
                return script_digest(head + fh.read())
        except OSError:
            return None

    def _report_rows(self, dist: InstalledDist, folders: list[str], unhashed: list[str], missing: list[str]) -> None:
        """One warning per kind of RECORD row that does not describe a file as it should."""
        for rows, what in (
            (folders, "names folders, not files (left out)"),
            (unhashed, "gives no hash (stored as found)"),
            (missing, "lists files that are gone (recorded as missing)"),
        ):
            if rows:
                shown = ", ".join(sorted(rows)[:3]) + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")
                self.warnings.append(f"{dist.display}: RECORD {what}: {shown}")


def _summary(man: dict, oid: str) -> dict:
    files = man["files"]
    counted = [f for f in files if f.get("state") != "missing" and not is_bytecode(f["record"])]
    return {
        "name": man["name"],
        "version": man["version"],
        "build_id": man["build_id"],
        "state_id": man["state_id"],
        "identity": IDENTITY_VERSION,
        "scripts": man["scripts"],
        "manifest": oid,
        "installer": man["installer"],
        "requested": man["requested"],
        "record": man["record"],
        "build_info": man["build_info"],
        "files": sum(1 for f in counted),
        "size": sum(f.get("size") or 0 for f in counted),
        "modified": sorted(f["path"] for f in files if f.get("state") == "modified"),
        "missing": sorted(f["path"] for f in files if f.get("state") == "missing"),
        "exec": _exec_files(counted),
    }


def _exec_files(files: list[dict]) -> list[str] | None:
    """Paths of the files with an execute bit (docs/format.md, "exec"); None when no mode was recorded."""
    if not any("mode" in f for f in files):
        return None
    return sorted(f["path"] for f in files
                  if "link" not in f and not f.get("generated") and (f.get("mode") or 0) & 0o111)


def _group_fresh(group: dict, prefix: Path, dist_info: Path) -> bool:
    """True when RECORD and every stored file still have the stats recorded at the last snap."""
    base = f"{prefix}/"
    lstat = os.lstat
    try:
        if stat_key(os.stat(dist_info / "RECORD")) != group["record_stat"]:
            return False
        if group.get("meta_stat") != stat_key(os.stat(dist_info / "METADATA")):
            return False
        for rel, key in zip(group["files"], group["stats"]):
            st = lstat(base + rel)
            if [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns] != key:
                return False
        if any(os.path.lexists(base + rel) for rel in group.get("missing", ())):
            return False
    except (OSError, KeyError, TypeError, ValueError):
        return False
    return True


def scan_environment(
    vault: Vault,
    prefix: Path,
    *,
    mode: str,
    writer=None,
    progress: Callable[[int], None] | None = None,
) -> tuple[Interpreter, list[dict], list[str], StatCache, Ingester, dict]:
    """Scan ``prefix``. ``mode``: "full" hashes files and stores new objects through ``writer``; "check"
    hashes files (to find in-place edits) and stores nothing; "lock" reads dist-info only. Manifests are
    queued on ``writer`` when one is given. Returns the interpreter, package summaries, warnings, ..."""
    from envvault.journal import JOURNAL_NAME

    if os.path.lexists(os.path.join(prefix, JOURNAL_NAME)):  # a killed restore: clean what it half-made first
        from envvault.journal import settle_interrupted

        settle_interrupted(vault, prefix)
    cache = statcache_for(vault, prefix)
    reader = reader_for(prefix, cache)
    interp = reader.interpreter()
    ing = Ingester(writer, vault.has, store=mode == "full")
    builder = _Builder(vault, interp, ing, cache, mode)
    mkey = "manifest_" + mode
    packages: list[dict] = []
    slow: list[InstalledDist] = []
    warnings: list[str] = []
    for dist_info, site in reader.dist_entries():
        key = dist_info.relative_to(prefix).as_posix()
        group = cache.groups.get(key)
        # Ids in the stat cache are trusted without consulting the index: the cache is saved only after
        # a commit, and gc deletes every stat cache before it removes anything.
        if mode != "lock" and group and group.get(mkey) and _group_fresh(group, prefix, dist_info):
            summary = dict(group["summary"], manifest=group[mkey])
            packages.append(summary)
            cache.touch(group["files"])
            continue
        if mode == "lock" and group and group.get("lock") and _lock_fresh(group["lock"], dist_info):
            packages.append(dict(group["lock"]["summary"]))
            continue
        dist = reader.read(dist_info, site)
        if dist is not None:
            slow.append(dist)
    if progress is not None and hasattr(progress, "set_total"):
        progress.set_total(sum(e.size or 0 for d in slow for e in (d.record or ())))
    done = 0
    for dist in slow:
        if dist.kind == "egg-link":
            warnings.append(f"{dist.display} is an old-style editable ({dist.dist_info.name}): its files live "
                            f"outside the environment, in {dist.target or '?'}, and are not stored")
        elif dist.record is None:
            warnings.append(f"{dist.display} has no RECORD ({dist.kind} install): its files are not stored; reinstall it with pip to make it restorable")
        man = builder.manifest(dist)
        data = canonical_json(man)
        oid = object_id(data)
        if writer is not None and not vault.has(oid) and not writer.queued(oid):
            writer.add(oid, data, "m")
        summary = _summary(man, oid)
        packages.append(summary)
        if dist.record is not None:
            try:
                _remember_group(cache, dist, prefix, man, summary, mode, oid)
            except OSError:
                pass
        done += sum(e.size or 0 for e in (dist.record or ()))
        if progress:
            progress(done)
    packages.sort(key=lambda p: (p["name"], p["version"]))
    warnings = builder.warnings + warnings
    stats = {"files": sum(p["files"] for p in packages), "bytes": sum(p["size"] for p in packages)}
    return interp, packages, warnings, cache, ing, stats


def _lock_fresh(lock: dict, dist_info: Path) -> bool:
    try:
        return (stat_key(os.stat(dist_info / "RECORD")) == lock["record_stat"]
                and stat_key(os.stat(dist_info / "METADATA")) == lock["meta_stat"])
    except (OSError, KeyError):
        return False


def _remember_group(cache: StatCache, dist, prefix: Path, man: dict, summary: dict, mode: str, oid: str) -> None:
    """Record what this scan learnt about one distribution, for the fast path of the next one.

    A group holds the stats of the distribution's files and, per mode, the manifest built from exactly
    those stats; manifests of other modes survive only while the stats are unchanged.
    """
    key = dist.dist_info.relative_to(prefix).as_posix()
    old = cache.groups.get(key) or {}
    record_stat = stat_key(os.stat(dist.dist_info / "RECORD"))
    meta_stat = stat_key(os.stat(dist.dist_info / "METADATA"))
    if mode == "lock":
        group = dict(old)
        group["lock"] = {"record_stat": record_stat, "meta_stat": meta_stat, "summary": summary}
        cache.set_group(key, group)
        return
    stored = [f["path"] for f in man["files"] if f["path"] in cache.files and "mode" in f and "link" not in f]
    stats = [cache.files[rel][0] for rel in stored]
    missing = [f["path"] for f in man["files"] if f.get("state") == "missing"]
    group = {
        "record_stat": record_stat,
        "meta_stat": meta_stat,
        "files": stored,
        "stats": stats,
        # Files that were missing must still be missing (a restore, or a user, may put them back).
        "missing": missing,
        "summary": {k: v for k, v in summary.items() if k != "manifest"},
        "manifest_" + mode: oid,
    }
    unchanged = all(old.get(k) == group[k] for k in ("record_stat", "meta_stat", "files", "stats", "missing"))
    for k in ("manifest_full", "manifest_check"):
        if unchanged and k in old and k not in group:
            group[k] = old[k]
    if "lock" in old:
        group["lock"] = old["lock"]
    cache.set_group(key, group)


def take_snapshot(
    vault: Vault,
    prefix: Path,
    *,
    message: str = "",
    lock_only: bool = False,
    trigger: str = "manual",
    argv: list[str] | None = None,
    progress: Callable[[int], None] | None = None,
    cache_hook: CacheHook | None = None,
    extra: dict | None = None,
) -> SnapResult:
    """Snapshot ``prefix`` into ``vault``. Objects first, then the snapshot file (the commit point)."""
    started = time.monotonic()
    with vault.lock():
        writer = vault.writer()
        try:
            interp, packages, warnings, cache, ing, stats = scan_environment(
                vault, prefix, mode="lock" if lock_only else "full", writer=writer, progress=progress
            )
            caches = cache_hook(vault, ing, cache) if cache_hook else []
            writer.flush()
        except BaseException:
            writer.abort()
            raise
        writer.close()
        crash_point("snap_objects")
        doc = {
            "format": FORMAT,
            "kind": "snapshot",
            "created": _now(),
            "message": message,
            "trigger": trigger,
            "argv": list(argv if argv is not None else sys.argv),
            "venv": str(prefix),
            "lock_only": lock_only,
            "python": interp.to_dict(),
            "host": host_facts(),
            "env": relevant_env(),
            "packages": packages,
            "caches": caches,
            "fingerprint": fingerprint(interp.version, packages),
            "warnings": warnings + [f"cache {c.get('kind')} {c.get('root')}: {w}" for c in caches
                                    for w in c.get("warnings", ())],
            "stats": {
                "files": stats["files"],
                "bytes": stats["bytes"],
                "new_bytes": writer.written_bytes,
                "new_objects": writer.written_objects,
                "seconds": round(time.monotonic() - started, 3),
            },
            "tool": {"envvault": __version__},
        }
        if extra:
            doc.update(extra)
        doc["stats"]["new_bytes"] += len(canonical_json(doc))
        sid = vault.commit_snapshot(doc)
    cache.save()
    return SnapResult(sid, doc)

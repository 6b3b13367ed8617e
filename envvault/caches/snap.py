"""Archiving compile caches: one cache tree manifest per cache root, in the same vault and through the same
``Ingester`` as environment snaps, so a file shared by two caches (or a cache and a venv) is stored once and
two near-identical precompiled headers share most of their chunks.

A cache may change while it is read (a compile running). Every file is taken only when its stat is the same
before and after the read (else it is read again, up to three times, then left out with a warning); the
tree is listed again after the pass and files that appeared meanwhile are taken in a second (and third)
round, so an Inductor entry is not archived without the kernels it names. The result is an archive of
complete files, each as it was at one moment, or a warning that says what was left out.

An unchanged cache costs one ``lstat`` per file and folder: each root keeps a shortcut in the stat cache
(folder and file stats, the entry it produced) and is re-read only when a stat differs.
"""

from __future__ import annotations

import dataclasses
import os
import stat as statmod
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import blake3

from ..errors import EnvironmentProblem, NotFoundError, UsageError
from ..model.encoding import canonical_json, object_id
from ..vault.ingest import Ingester, StatCache, stat_key
from .discover import CacheLocation, discover_caches, inductor_cache_dir, usable_kinds

# manifest, walk and fingerprint are imported where a cache is actually read: an unchanged one is not.

__all__ = [
    "CacheSnapResult",
    "make_cache_hook",
    "take_cache_snapshot",
    "locations_to_snap",
    "archive_cache",
    "environment_fingerprint",
    "builder_fingerprint",
    "entry_key",
    "summarise_entries",
]

KEY_PREFIX = "cache:"  # stat cache keys: cache:<root>/<path> per file, cache:<root> per root
_READ_ATTEMPTS = 4
_RACY_NS = 30_000_000  # 30 ms: more than a coarse timestamp tick
_ROUNDS = 3
_FP_FIELDS = ("torch_record", "torch_source_key", "triton_version", "triton_record", "gpus", "python_version")
_TORCH_FIELDS = ("torch_version", "torch_git_version", "torch_cuda", "torch_hip", "torch_key_hash")


@dataclass(frozen=True)
class CacheSnapResult:
    """A committed cache-only snapshot."""

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
            "caches": d["caches"],
            "new_bytes": d["stats"]["new_bytes"],
            "new_objects": d["stats"]["new_objects"],
            "seconds": d["stats"]["seconds"],
            "warnings": d["warnings"],
        }


# -- which roots ------------------------------------------------------------------------------------


def locations_to_snap(
    env: Mapping[str, str] = os.environ,
    extra: Sequence[Path] = (),
    *,
    discover: bool = True,
    use_torch_python: Path | None = None,
    kinds: frozenset[str] | None = None,
) -> list[CacheLocation]:
    """The existing cache roots to archive: torch's, Triton's, CUDA's and ``extra`` (unless ``discover``
    is false: then ``extra`` only), only those of ``kinds`` when given. A root inside another one is left
    to the outer one.

    With ``TORCHINDUCTOR_CACHE_DIR`` set, Inductor still keeps precompiled C++ headers under its default
    root (``codecache._HEADER_DIR`` is ``default_cache_dir()/precompiled_headers``), so that folder is a
    root of its own: without it a warm CPU compile rebuilds a 150 MB header.
    """
    if discover:
        found = discover_caches(env, extra, use_torch_python=use_torch_python)
        if "TORCHINDUCTOR_CACHE_DIR" in env:
            default, _ = inductor_cache_dir({k: v for k, v in env.items() if k != "TORCHINDUCTOR_CACHE_DIR"})
            pch = default / "precompiled_headers"
            found.append(CacheLocation(kind="inductor", path=pch, exists=pch.is_dir(),
                                       reason="Inductor's precompiled headers (kept under the default root)"))
    else:
        found = []
        for p in extra:
            path = Path(os.path.abspath(os.path.expanduser(str(p))))
            if all(loc.path != path for loc in found):
                found.append(CacheLocation(kind="user", path=path, exists=path.is_dir(), reason="configured"))
    roots = [loc for loc in found if loc.exists and (kinds is None or loc.kind in kinds)]
    real = {loc.path: os.path.realpath(loc.path) for loc in roots}
    kept: list[CacheLocation] = []
    for loc in roots:
        inside = [o for o in roots if o is not loc and _within(real[loc.path], real[o.path])]
        if any(real[o.path] != real[loc.path] for o in inside):
            continue  # nested in another root
        if any(real[o.path] == real[loc.path] for o in kept):
            continue  # the same folder under two names
        kept.append(loc)
    return kept


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


# -- fingerprints -----------------------------------------------------------------------------------


def environment_fingerprint(venv: Path | None, statcache: StatCache | None = None,
                            env: Mapping[str, str] = os.environ) -> tuple[dict | None, str | None]:
    """``(fingerprint_venv(venv) with GPUs, as Fingerprint.to_dict(), None)``, or ``(None, why)`` when
    ``venv`` is None or unreadable.

    Kept in ``statcache`` while the venv's torch, Triton, interpreter, compile variables and GPUs are
    unchanged, so an unchanged environment costs a few ``stat`` calls, not RECORD parses and nvidia-smi.
    """
    if venv is None:
        return None, None
    parts = _fp_key(venv, env)
    key = None if parts is None else blake3.blake3(canonical_json(parts)).hexdigest()
    hit = statcache.extra.get("cache_env_fp") if statcache is not None else None
    if key is not None and isinstance(hit, dict) and hit.get("key") == key and isinstance(hit.get("fp"), dict):
        return hit["fp"], None
    from .fingerprint import fingerprint_venv, probe_gpus

    try:
        fp = fingerprint_venv(venv, env=env, probe_gpu=False)
    except (UsageError, EnvironmentProblem) as err:
        return None, f"no fingerprint of {venv}: {err}"
    fp = dataclasses.replace(fp, gpus=probe_gpus(env)).to_dict()
    if statcache is not None and key is not None:
        statcache.extra["cache_env_fp"] = {"key": key, "fp": fp}
        statcache.mark_dirty()
    return fp, None


def _fp_key(venv: Path, env: Mapping[str, str]) -> list | None:
    """What ``fingerprint_venv`` reads, as stats, plus the compile variables and the GPUs the driver sees."""
    parts: list[Any] = [str(venv)]
    try:
        sites = sorted(f"{venv}/lib/{d}/site-packages" for d in os.listdir(f"{venv}/lib") if d.startswith("python"))
    except OSError:
        sites = []
    for p in [f"{venv}/pyvenv.cfg"] + [f"{s}{rel}" for s in sites for rel in ("", "/torch/version.py",
                                                                                "/triton/__init__.py")]:
        try:
            parts.append(stat_key(os.stat(p)))
        except OSError:
            parts.append(None)
    # Every variable compile_env() could keep (a superset, so no import is needed to compute it).
    words = ("TORCH", "TRITON", "INDUCTOR", "LLVM", "MLIR", "MMA", "PTX", "AMDGCN", "TMEM", "DISABLE_", "USE_")
    parts.append(sorted((k, v) for k, v in env.items() if any(w in k for w in words)))
    if not _on_path("nvidia-smi", env.get("PATH", os.defpath)):
        parts.append("no nvidia-smi")
    else:
        try:  # the GPUs the driver sees, without running nvidia-smi
            parts.append(sorted(os.listdir("/proc/driver/nvidia/gpus")))
            with open("/proc/driver/nvidia/version", "rb") as f:
                parts.append(f.readline().decode("ascii", "replace"))
        except OSError:
            return None
    return parts


def _on_path(name: str, path: str) -> bool:
    # shutil.which without importing shutil (it costs an unchanged snap more than the check itself)
    return any(os.access(os.path.join(d, name), os.X_OK) for d in path.split(os.pathsep) if d)


def builder_fingerprint(tree, env_fp):
    """The fingerprint to keep with a cache: what the tree says about its builder, completed from the
    environment it was snapped in when the two agree on torch (a cache carried over from another torch
    keeps only what the tree says). Origin stays ``tree``: unknown fields never count as differences."""
    if env_fp is None:
        return tree
    if tree.torch_version is not None and env_fp.torch_version not in (None, tree.torch_version):
        return tree
    fill: dict[str, Any] = {}
    names = _FP_FIELDS + (() if tree.torch_version is not None else _TORCH_FIELDS)
    for name in names:
        if getattr(tree, name) is None and getattr(env_fp, name) is not None:
            fill[name] = getattr(env_fp, name)
    if tree.torch_version is not None and tree.torch_git_version is None and env_fp.torch_git_version:
        fill["torch_git_version"] = env_fp.torch_git_version
    if tree.env_scope == "none":
        fill.update(env=env_fp.env, env_scope=env_fp.env_scope)
    if not fill:
        return tree
    note = "completed from the environment at snap time: " + ", ".join(sorted(fill))
    return dataclasses.replace(tree, notes=tree.notes + (note,), **fill)


# -- archiving one root -----------------------------------------------------------------------------


def archive_cache(
    vault,
    ingester: Ingester,
    statcache: StatCache,
    location: CacheLocation,
    *,
    env_fp: dict | None = None,
) -> dict:
    """Archive one cache root; returns its snapshot entry (``kind``, ``root``, ``manifest``, ``files``,
    ``bytes``, ``entries``, ``fingerprint``, ``warnings``, ``seconds``, ``reused``). ``env_fp`` is the
    fingerprint (``Fingerprint.to_dict()``) of the environment snapped with it. New objects and the manifest
    are queued on ``ingester.writer``; the caller flushes it and commits the snapshot."""
    started = time.monotonic()
    root = Path(location.path)
    gkey = KEY_PREFIX + str(root)
    env_key = blake3.blake3(canonical_json(env_fp)).hexdigest()
    group = statcache.groups.get(gkey)
    fresh = isinstance(group, dict) and _fresh(root, group)
    if fresh and group.get("env_key") == env_key and isinstance(group.get("entry"), dict):
        statcache.touch([gkey + "/" + rel for rel in group["files"]])
        return dict(group["entry"], seconds=round(time.monotonic() - started, 3), reused=True)
    from concurrent.futures import ThreadPoolExecutor

    from ._tree import fingerprint_from_tree
    from .fingerprint import Fingerprint
    from .manifest import CacheManifest

    dirs = _dir_stats(root)
    with ThreadPoolExecutor(max_workers=_readers()) as pool:
        tree_fp = None
        if fresh and isinstance(group.get("tree_fp"), dict):
            try:
                tree_fp = Fingerprint.from_dict(group["tree_fp"])
            except Exception:  # noqa: BLE001 - recomputed below
                tree_fp = None
        # The tree's own fingerprint reads the graph entries: do it while the files are archived.
        tree_job = pool.submit(fingerprint_from_tree, root) if tree_fp is None else None
        # ``vault.has`` re-lists index/ on every call; one look at the index serves the whole read.
        known = vault.index().__contains__
        files, stats, warnings = _read_tree(root, dirs, ingester, known, statcache, gkey + "/", pool)
        if tree_job is not None:
            tree_fp = tree_job.result()
    fp = builder_fingerprint(tree_fp, Fingerprint.from_dict(env_fp) if env_fp else None)
    manifest = CacheManifest(cache_kind=location.kind, root=str(root), fingerprint=fp, files=tuple(files))
    data = canonical_json(manifest.to_dict())
    mid = object_id(data)
    writer = ingester.writer
    if writer is not None and not known(mid) and not writer.queued(mid):
        writer.add(mid, data, "m")
    regular = [f for f in files if f.kind == "file"]
    entry = {
        "kind": location.kind,
        "root": str(root),
        "reason": location.reason,
        "manifest": mid,
        "files": len(regular) + sum(1 for f in files if f.kind == "link"),
        "bytes": sum(f.size for f in regular),
        "entries": summarise_entries(location.kind, [f.path for f in regular]),
        "fingerprint": fp.to_dict(),
        "warnings": warnings,
    }
    if warnings:
        statcache.groups.pop(gkey, None)  # not a clean picture: read it again next time
        statcache.mark_dirty()
    else:
        statcache.set_group(gkey, {
            "dirs": dirs, "files": [rel for rel, _ in stats], "stats": [key for _, key in stats],
            "tree_fp": tree_fp.to_dict(), "env_key": env_key, "entry": entry,
        })
    return dict(entry, seconds=round(time.monotonic() - started, 3), reused=False)


def _readers() -> int:
    # Reading, hashing and chunking release the GIL; a few threads keep the disk and every core busy.
    return max(2, min(os.cpu_count() or 1, 6))


class _SharedWriter:
    """One ``PackWriter`` fed by several reading threads (it takes objects from one producer at a time)."""

    def __init__(self, writer) -> None:
        self._writer = writer
        self._lock = threading.Lock()

    def add(self, oid: str, data: bytes, kind: str = "b") -> None:
        with self._lock:
            self._writer.add(oid, data, kind)

    def queued(self, oid: str) -> bool:
        return self._writer.queued(oid)


def _is_transient_dir(rel: str) -> bool:
    from .walk import is_transient

    return is_transient(rel, is_dir=True)


def _dir_stats(root: Path) -> list[list]:
    """[path, ctime_ns, inode] of every folder the walk enters; taken before the walk, so a change made
    after it shows up at the next snap. A folder's ctime moves whenever an entry is added, removed or
    renamed in it (and on chmod)."""
    out: list[list] = []
    stack = [("", str(root))]
    while stack:
        rel, path = stack.pop()
        try:
            st = os.lstat(path)
            with os.scandir(path) as it:
                subs = [(e.name, e.path) for e in it if e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as err:
            raise EnvironmentProblem(f"cannot read cache folder {path}: {err.strerror}") from None
        out.append([rel, st.st_ctime_ns, st.st_ino])
        for name, sub in subs:
            r = f"{rel}/{name}" if rel else name
            if r != "locks" and not _is_transient_dir(r):
                stack.append((r, sub))
    return out


def _fresh(root: Path, group: dict) -> bool:
    """True when every folder and file of the last archive still has the stats recorded then."""
    base = f"{root}/"
    lstat = os.lstat
    try:
        for rel, ctime, ino in group["dirs"]:
            st = lstat(base + rel if rel else str(root))
            if st.st_ctime_ns != ctime or st.st_ino != ino:
                return False
        for rel, key in zip(group["files"], group["stats"], strict=True):
            st = lstat(base + rel)
            if [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns] != key:
                return False
    except (OSError, KeyError, TypeError, ValueError):
        return False
    return True


def _read_tree(root: Path, dirs: list[list], ing: Ingester, known, cache: StatCache, prefix: str, pool):
    from .manifest import ManifestFile
    from .walk import walk_cache

    files: dict[str, ManifestFile] = {}
    stats: list[tuple[str, list]] = []
    warnings: list[str] = []
    seen: set[str] = set()
    cache.files  # noqa: B018 - load the per-file stat cache before the reading threads share it
    local = threading.local()
    shared = _SharedWriter(ing.writer) if ing.writer is not None else None

    def take(rel: str):
        mine = getattr(local, "ingester", None)
        if mine is None:
            mine = local.ingester = Ingester(shared, known, store=ing.store)
        return rel, _take_file(f"{root}/{rel}", prefix + rel, mine, cache)

    pending = walk_cache(root)
    for _ in range(_ROUNDS):
        regular = []
        for cf in pending:
            seen.add(cf.path)
            if cf.is_dir:
                files[cf.path] = ManifestFile(path=cf.path, kind="dir", mode=cf.mode)
            elif cf.is_symlink:
                if cf.escapes_root:
                    warnings.append(f"{root}: left out {cf.path}, a symlink that leads outside the cache ({cf.target})")
                else:
                    files[cf.path] = ManifestFile(path=cf.path, kind="link", mode=cf.mode, target=cf.target)
            else:
                regular.append(cf.path)
        for rel, got in pool.map(take, regular):
            if isinstance(got, str):
                warnings.append(f"{root}: left out {rel}: {got}")
            elif got is not None:
                st, sha, chunks = got
                files[rel] = ManifestFile(path=rel, kind="file", mode=statmod.S_IMODE(st.st_mode),
                                          size=st.st_size, sha256=sha, chunks=tuple(chunks))
                stats.append((rel, stat_key(st)))
        now = _dir_stats(root)
        if now == dirs:
            pending = []
            break  # no folder changed: nothing appeared or vanished since the listing
        dirs = now
        pending = [cf for cf in walk_cache(root) if cf.path not in seen]
        if not pending:
            break
    else:
        warnings.append(
            f"{root}: still being written while it was archived; {len(pending)} file(s) that appeared during "
            "the snap were left out (every archived file is complete); snap again when the compile has finished"
        )
    # A folder noted empty that got files meanwhile is implied by them.
    dirs_with_content = {p.rsplit("/", 1)[0] for p in files if "/" in p}
    for rel in [r for r, f in files.items() if f.kind == "dir" and r in dirs_with_content]:
        del files[rel]
    return sorted(files.values(), key=lambda f: f.path), stats, warnings


def _take_file(path: str, key: str, ing: Ingester, cache: StatCache):
    """(stat, sha256, chunks) of a file read whole while it did not change; None when it vanished or is no
    longer a regular file; a reason (str) when it could not be read consistently.

    A file modified within the last ``_RACY_NS`` is read only after it settles: on filesystems with coarse
    timestamps a write in the same clock tick as the last one leaves mtime and ctime as they were, so the
    before/after comparison would not see it (git's "racy" files).
    """
    for attempt in range(_READ_ATTEMPTS):
        if attempt:
            time.sleep(_RACY_NS / 1e9 * attempt)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not statmod.S_ISREG(st.st_mode):
            return None
        hit = cache.lookup(key, st)
        if hit is not None and hit[2] is not None:
            return st, hit[1], hit[2]
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS:
            continue
        try:
            digest = ing.ingest(path, st.st_size)
        except EnvironmentProblem as err:
            if not os.path.lexists(path):
                return None
            return str(err)
        try:
            after = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat_key(after) == stat_key(st) and digest.size == st.st_size and statmod.S_ISREG(after.st_mode):
            cache.put(key, st, digest.sha256, digest.chunks)
            return st, digest.sha256, digest.chunks
    return f"it was being written each time it was read ({_READ_ATTEMPTS} tries): a compile rewriting it in place?"


# -- entries (what a person calls an entry of a cache) ----------------------------------------------


def entry_key(kind: str, path: str) -> str:
    """The logical cache entry a file belongs to: an FX graph, an AOT autograd entry, a Triton kernel
    folder, or the file itself (generated kernels and ``.so`` files in two-letter folders)."""
    parts = path.split("/")
    if parts[0] == "fxgraph" and len(parts) >= 4:
        return "/".join(parts[:3])
    if parts[0] == "aotautograd" and len(parts) >= 3:
        return "/".join(parts[:2])
    if parts[0] == "triton" and len(parts) >= 4:
        return "/".join(parts[:3])
    if kind == "triton" and len(parts) >= 2:
        return parts[0]
    return path


def summarise_entries(kind: str, paths: Sequence[str]) -> dict[str, int]:
    """Entry counts by category (``fxgraph``, ``aotautograd``, ``triton``, ``kernels``, ``other``...)."""
    keys = {entry_key(kind, p) for p in paths}
    out: dict[str, int] = {}
    for k in keys:
        head = k.split("/", 1)[0]
        if kind == "triton":
            cat = "triton"
        elif head in ("fxgraph", "aotautograd", "triton", "precompiled_headers"):
            cat = head
        elif len(head) == 2 and "/" in k:
            cat = "kernels"
        elif k.endswith((".gch", ".h")) and kind == "inductor":
            cat = "precompiled_headers"
        else:
            cat = "other"
        out[cat] = out.get(cat, 0) + 1
    return dict(sorted(out.items()))


# -- hooks and the cache-only snapshot --------------------------------------------------------------

CacheHook = Callable[[Any, Ingester, StatCache], "list[dict]"]


def make_cache_hook(
    vault,
    target: Path | None,
    extra_dirs: Sequence[Path] = (),
    *,
    env: Mapping[str, str] = os.environ,
    discover: bool = True,
    use_torch_python: Path | None = None,
    usable_only: bool = True,
) -> CacheHook:
    """The ``cache_hook`` for ``take_snapshot``: archives the caches of a process started with ``env``
    (plus ``extra_dirs`` and the configured dirs), fingerprinted against ``target``'s torch.

    With ``usable_only`` (an environment's snap), a discovered cache is taken only when ``target`` can use
    it (:func:`~envvault.caches.discover.usable_kinds`: no Inductor cache for a venv without torch); the
    ``--cache-dir`` and configured folders always are. ``cache snap`` passes False: it archives what it finds.
    """
    from .config import configured_dirs

    def hook(vault_, ingester: Ingester, statcache: StatCache) -> list[dict]:
        extra = list(extra_dirs) + configured_dirs(vault_.settings(), target)
        kinds = usable_kinds(target) if usable_only and target is not None else None
        locations = locations_to_snap(env, extra, discover=discover, use_torch_python=use_torch_python,
                                      kinds=kinds)
        env_fp, why = environment_fingerprint(target, statcache, env)
        entries = []
        for loc in locations:
            try:
                entries.append(archive_cache(vault_, ingester, statcache, loc, env_fp=env_fp))
            except NotFoundError:
                continue  # removed since it was found: nothing to archive
            except EnvironmentProblem as err:
                # An unreadable cache must not fail the environment's snap: record why it is missing.
                entries.append({"kind": loc.kind, "root": str(loc.path), "reason": loc.reason, "manifest": None,
                                "files": 0, "bytes": 0, "entries": {}, "fingerprint": None,
                                "warnings": [f"{loc.path}: not archived: {err}"]})
        if why and entries:
            entries[0]["warnings"] = entries[0]["warnings"] + [why]
        return entries

    return hook


def take_cache_snapshot(
    vault,
    *,
    venv: Path | None = None,
    extra_dirs: Sequence[Path] = (),
    discover: bool = True,
    message: str = "",
    env: Mapping[str, str] = os.environ,
    use_torch_python: Path | None = None,
    argv: list[str] | None = None,
) -> CacheSnapResult:
    """Archive the caches alone into a snapshot of kind ``cache-snapshot`` (no packages). ``venv`` is the
    environment that uses the caches, for their fingerprint; it may be None. Objects first, then the
    snapshot file (the commit point), as every snap."""
    from envvault import __version__
    from envvault.env.host import host_facts, relevant_env
    from envvault.vault.store import FORMAT as VAULT_FORMAT
    from envvault.vault.store import _now

    started = time.monotonic()
    statcache = StatCache(vault.state_path("stat-caches"))
    hook = make_cache_hook(vault, venv, extra_dirs, env=env, discover=discover, use_torch_python=use_torch_python,
                           usable_only=False)
    with vault.lock():
        writer = vault.writer()
        try:
            ingester = Ingester(writer, vault.has)
            caches = hook(vault, ingester, statcache)
            writer.flush()
        except BaseException:
            writer.abort()
            raise
        writer.close()
        warnings = [w for c in caches for w in c["warnings"]]
        if not caches:
            warnings.append("no compile cache found: nothing was archived (see `envvault cache list --where`)")
        doc = {
            "format": VAULT_FORMAT,
            "kind": "cache-snapshot",
            "created": _now(),
            "message": message,
            "trigger": "cache-snap",
            "argv": list(argv if argv is not None else sys.argv),
            "venv": str(venv) if venv else None,
            "lock_only": False,
            # No interpreter (every field null): an environment restore of this snapshot refuses, as for an
            # interpreter that differs, instead of removing every package the snapshot does not list.
            "python": dict.fromkeys(("implementation", "version", "abi", "soabi", "platform")),
            "host": host_facts(),
            "env": relevant_env(),
            "packages": [],
            "caches": caches,
            "fingerprint": None,
            "warnings": warnings,
            "stats": {
                "files": sum(c["files"] for c in caches),
                "bytes": sum(c["bytes"] for c in caches),
                "new_bytes": writer.written_bytes,
                "new_objects": writer.written_objects,
                "seconds": round(time.monotonic() - started, 3),
            },
            "tool": {"envvault": __version__},
        }
        doc["stats"]["new_bytes"] += len(canonical_json(doc))
        sid = vault.commit_snapshot(doc)
    statcache.save()
    return CacheSnapResult(sid, doc)

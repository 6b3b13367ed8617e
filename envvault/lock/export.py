"""Export a snapshot as a PEP 751 ``pylock.toml`` (plus rebuilt wheels) or a requirements file."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

import tomli_w

from envvault import __version__
from envvault.errors import CorruptError, UsageError
from envvault.lock.sources import describe, original_source, pylock_entries, resolve_sources
from envvault.lock.wheels import check_wheel_source, rebuild_wheel, wheel_filename
from envvault.model.manifest import DistManifest, as_dist_manifest
from envvault.model.snapshot import PackageSummary, Snapshot, as_package, as_snapshot
from envvault.vault.fsutil import atomic_write
from envvault.vault.store import Vault

__all__ = ["export_snapshot", "pylock_document", "original_source", "direct_reference", "requires_python"]


def _local_path(url: str) -> str | None:
    """The path of a ``file://`` URL (uv takes local files as paths, not URLs), else None."""
    parts = urlsplit(url)
    return unquote(parts.path) if parts.scheme == "file" and parts.netloc in ("", "localhost") else None


def _where(url: str) -> dict:
    path = _local_path(url)
    return {"path": path} if path is not None else {"url": url}


def direct_reference(man: DistManifest | dict) -> dict | None:
    """Where the installer says the distribution came from (``direct_url.json``, PEP 610), as the PEP 751
    source table it maps to: ``{"directory": {path, editable?, subdirectory?}}`` (a local folder, editable
    or not), ``{"archive": {url | path, hashes, subdirectory?}}`` (a direct URL to a wheel or sdist; only with
    a recorded hash, which PEP 751 requires), ``{"vcs": {type, url | path, commit-id, ...}}``; else None
    (installed from an index, or nothing usable recorded)."""
    man = as_dist_manifest(man)
    du = man.direct_url  # the installer's PEP 610 document, read as such
    if not isinstance(du, dict) or not isinstance(du.get("url"), str):
        return None
    url, sub = du["url"], du.get("subdirectory")
    extra = {"subdirectory": sub} if isinstance(sub, str) and sub else {}
    if isinstance(du.get("dir_info"), dict):
        path = _local_path(url)
        if path is None:
            return None
        table = {"path": path, **extra}
        if du["dir_info"].get("editable") is True:
            table["editable"] = True
        return {"directory": table}
    if isinstance(du.get("vcs_info"), dict):
        info = du["vcs_info"]
        if not (isinstance(info.get("vcs"), str) and isinstance(info.get("commit_id"), str)):
            return None
        table = {"type": info["vcs"], **_where(url), "commit-id": info["commit_id"], **extra}
        if isinstance(info.get("requested_revision"), str):
            table["requested-revision"] = info["requested_revision"]
        return {"vcs": table}
    src = original_source(man)
    if src is not None and src.get("hashes"):
        return {"archive": {**_where(url), "hashes": src["hashes"], **extra}}
    return None


# A requirements line is parsed by pip line by line: a name (PEP 508) and a version (PEP 440 and a local
# part) of these letters only, so that no snapshot adds a line or an option to it.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_VERSION_TEXT = re.compile(r"[A-Za-z0-9.+!_-]+")


def requirement_line(p: PackageSummary, man: DistManifest | None) -> str:
    """One requirements.txt line: ``name @ url`` for a direct reference (``-e url`` for an editable),
    else ``name==version``; the build id as a comment."""
    if not _NAME.fullmatch(p.name or "") or not _VERSION_TEXT.fullmatch(p.version or ""):
        raise CorruptError(f"the snapshot's package {p.name!r:.80} {p.version!r:.40} is not a name and version a "
                           "requirements file can hold; refused")
    du = man.direct_url if man is not None else None
    ref = direct_reference(man) if man is not None else None
    pin = f"{p.name}=={p.version}"
    if ref is not None:
        url = du["url"]
        if "vcs" in ref:
            url = f"{ref['vcs']['type']}+{url}@{ref['vcs']['commit-id']}"
        if du.get("subdirectory"):
            url += f"#subdirectory={du['subdirectory']}"
        editable = ref.get("directory", {}).get("editable")
        pin = f"-e {url}" if editable else f"{p.name} @ {url}"
    return f"{pin}  # build {p.build_id[:16]}"


def requires_python(version: str) -> str:
    """What the environment needs: its minor version (``==3.11.*``), not the exact patch."""
    major, minor = version.split(".")[:2]
    return f"=={major}.{minor}.*"


def pylock_document(doc: Snapshot | dict, entries: list[dict]) -> dict:
    """``entries``: per package {summary (a ``PackageSummary``), wheel: {name, path, size, sha256} | None,
    source, origin?}. ``origin``: a ``direct_reference`` table, written as the package's source when no
    wheel is."""
    snap = as_snapshot(doc)
    packages = []
    for e in entries:
        p = as_package(e["summary"])
        pkg: dict = {"name": p.name, "version": p.version}
        wheel = e.get("wheel")
        src = e.get("source")
        origin = e.get("origin")
        if wheel is not None:
            w = {"name": wheel["name"], "path": wheel["path"], "size": wheel["size"],
                 "hashes": {"sha256": wheel["sha256"]}}
            pkg["wheels"] = [w]
        elif origin is not None:
            pkg.update(origin)
        elif src and src.get("hashes") and src["url"].endswith(".whl"):
            pkg["wheels"] = [{"name": src["url"].rsplit("/", 1)[-1], **_where(src["url"]), "hashes": src["hashes"]}]
        tool = {"build_id": p.build_id, "state_id": p.state_id, "identity": p.identity, "snapshot": e["snapshot"]}
        if p.installer:
            tool["installer"] = p.installer
        if p.build_info:
            tool["build_info"] = {k: v for k, v in p.build_info.items() if v is not None}
        if p.modified:
            tool["modified_files"] = list(p.modified)
        if src:
            tool["source"] = src
        if origin is not None and wheel is not None:
            tool["origin"] = origin  # where the installer took it from; the wheel holds its installed files
        pkg["tool"] = {"envvault": tool}
        packages.append(pkg)
    py = snap.python.exact_version()
    return {
        "lock-version": "1.0",
        "created-by": "envvault",
        "requires-python": requires_python(py),
        "packages": packages,
        "tool": {"envvault": {"version": __version__, "snapshot": entries[0]["snapshot"] if entries else None,
                              "python": py, "abi": snap.python.abi}},
    }


def _manifests(vault: Vault, sid: str, snap: Snapshot) -> dict[str, DistManifest]:
    """Every package's manifest, read (and its paths checked) before anything is written: one missing (a
    lost pack or index file) is damaged data (exit 5), not a package without a source."""
    out, lost = {}, []
    for p in snap.packages:
        if vault.has(p.manifest):
            out[p.manifest] = vault.load_manifest(p.manifest)
        else:
            lost.append(f"{p.name} {p.version}")
    if lost:
        raise CorruptError(f"snapshot {sid[:12]}: the vault lacks the manifests of {', '.join(lost[:10])}"
                           f"{' and more' if len(lost) > 10 else ''} (a pack or index file is missing); "
                           "run `envvault verify`")
    return out


def _check_rebuildable(vault: Vault, sid: str, snap: Snapshot, man: DistManifest) -> None:
    """Refuse an unsafe manifest, and fail (exit 5) on a missing file object, before any wheel is written."""
    check_wheel_source(man, snap.python)
    for f in man.files:
        if any(not vault.has(c) for c in f.chunks or ()):
            raise CorruptError(f"snapshot {sid[:12]}: the vault lacks stored bytes of {man.name} {man.version} "
                               f"({f.path}; a pack or index file is missing); run `envvault verify`")


def export_snapshot(vault: Vault, sid: str, out: Path, *, fmt: str = "pylock", wheels: bool = True) -> dict:
    """Write the lockfile (and, for pylock, a ``<stem>.wheels/`` folder beside it). Returns a summary.

    Everything is checked before anything is written (names, versions and member paths of the wheels to
    rebuild; every manifest and stored file present), wheels are written next, and the lockfile last
    (temp + rename); a failure removes the wheels this export wrote."""
    doc = vault.load_snapshot(sid).snapshot
    warnings: list[str] = []
    if fmt not in ("pylock", "requirements"):
        raise UsageError(f"unknown export format {fmt!r}; use pylock or requirements")
    if os.path.lexists(out) and (os.path.islink(out) or not os.path.isfile(out)):
        # The lockfile is written by rename: over a link it would replace the link (its target kept the old
        # bytes), over a device or FIFO the node itself (``-o /dev/full`` as root, helper 31).
        raise UsageError(f"{out} is a symlink or not a regular file; pass -o with a file path (its folder gets "
                         "the wheels too)")
    manifests = _manifests(vault, sid, doc)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "requirements":
        lines = [f"# exported by envvault {__version__} from snapshot {sid}", f"# python {doc.python.version}"]
        for p in doc.packages:
            lines.append(requirement_line(p, manifests.get(p.manifest)))
        atomic_write(out, ("\n".join(lines) + "\n").encode(), mode=0o644)
        return {"path": str(out), "format": fmt, "packages": len(doc.packages), "warnings": warnings}
    wheel_dir = out.parent / f"{out.stem}.wheels"
    if doc.lock_only:
        made_dir = not wheel_dir.exists()
        there = set() if made_dir else set(os.listdir(wheel_dir))
        try:
            entries, lock_warnings = _lock_only_entries(vault, sid, doc, wheel_dir, out.parent, wheels)
            atomic_write(out, tomli_w.dumps(pylock_document(doc, entries)).encode(), mode=0o644)
        except BaseException:
            if made_dir:  # a refused or damaged copy: no wheel folder left half-filled
                shutil.rmtree(wheel_dir, ignore_errors=True)
            else:  # the folder was there: only what this export added to it goes
                for name in set(os.listdir(wheel_dir)) - there:
                    try:
                        os.unlink(wheel_dir / name)
                    except OSError:
                        pass
            raise
        n_wheels = sum(1 for e in entries if e["wheel"])
        return {"path": str(out), "format": fmt, "packages": len(entries), "wheels": n_wheels,
                "wheel_dir": str(wheel_dir) if n_wheels else None,
                "warnings": warnings + lock_warnings + _unnamed_wheels(wheel_dir, entries, out)}
    plan = []
    for p in doc.packages:
        man = manifests[p.manifest]
        origin = direct_reference(man)
        editable = bool(origin and origin.get("directory", {}).get("editable"))
        rebuild = wheels and man.record == "ok" and not editable
        if rebuild:
            _check_rebuildable(vault, sid, doc, man)
        plan.append((p, man, origin, rebuild))
    entries = []
    made: list[Path] = []
    made_dir = not wheel_dir.exists()
    try:
        jobs = [(i, man) for i, (_p, man, _o, rebuild) in enumerate(plan) if rebuild]
        if jobs:
            wheel_dir.mkdir(parents=True, exist_ok=True)
        built = rebuild_wheels(vault, doc.python, jobs, wheel_dir, made)
        for i, (p, man, origin, rebuild) in enumerate(plan):
            entry = {"summary": p, "snapshot": sid, "source": original_source(man), "wheel": None, "origin": origin}
            if rebuild:
                path, sha, size = built[i]
                entry["wheel"] = {"name": path.name, "path": os.path.relpath(path, out.parent), "size": size,
                                  "sha256": sha}
            elif origin is not None and "directory" in origin and not os.path.isdir(origin["directory"]["path"]):
                warnings.append(f"{p.name} {p.version}: the lock installs it from {origin['directory']['path']}, "
                                "which no longer exists")
            elif origin is None and man.record != "ok":
                warnings.append(f"{p.name} {p.version}: files not in the vault; "
                                "the lock names it without a source")
            entries.append(entry)
        atomic_write(out, tomli_w.dumps(pylock_document(doc, entries)).encode(), mode=0o644)
    except BaseException:
        for path in made:
            try:
                path.unlink()
            except OSError:
                pass
        if made_dir:
            shutil.rmtree(wheel_dir, ignore_errors=True)
        raise
    bare = [f"{p.name} {p.version}" for (p, man, origin, _r), e in zip(plan, entries)
            if e["wheel"] is None and origin is None and man.record == "ok"]
    if bare:
        warnings.append(f"{len(bare)} package{'s' if len(bare) != 1 else ''} installed from an index "
                        f"{'have' if len(bare) != 1 else 'has'} no source in the lock (--no-wheels): "
                        f"{', '.join(bare[:10])}{' and more' if len(bare) > 10 else ''}; an installer must find "
                        "them on its index by name and version")
    n_wheels = sum(1 for e in entries if e["wheel"])
    return {"path": str(out), "format": fmt, "packages": len(entries), "wheels": n_wheels,
            "wheel_dir": str(wheel_dir) if n_wheels else None,
            "warnings": warnings + _unnamed_wheels(wheel_dir, entries, out)}


def _unnamed_wheels(wheel_dir: Path, entries: list[dict], out: Path) -> list[str]:
    """A warning when the wheel folder holds wheels the lock does not name (an earlier export to the same
    ``-o``): they are left there (the folder may hold what a person put in it), but an installer pointed at
    the folder (``--find-links``) could pick one."""
    named = {e["wheel"]["name"] for e in entries if e["wheel"]}
    try:
        others = sorted(n for n in os.listdir(wheel_dir) if n.endswith(".whl") and n not in named)
    except OSError:
        return []
    if not others:
        return []
    listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    return [f"{wheel_dir} also holds {len(others)} wheel(s) {out.name} does not name ({listed}), from an earlier "
            "export? Installing from the lock uses only its own; remove them if nothing else needs them"]


def rebuild_wheels(vault: Vault, python, jobs: list[tuple[int, DistManifest]], wheel_dir: Path,
                   made: list[Path]) -> dict[int, tuple[Path, str, int]]:
    """Rebuild the wheels of ``jobs`` (key, manifest) in ``wheel_dir`` at once, the largest first, on a
    thread pool (zstd, hashing and file writes release the GIL); a large file's chunks are decompressed
    ahead on a second pool. Returns key -> (path, sha256, size); every wheel written that was not there
    before is appended to ``made`` (also when another fails, so the caller can remove them)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from envvault.materialize import WORKERS

    existed = {i: (wheel_dir / wheel_filename(man)).exists() for i, man in jobs}
    order = sorted(jobs, key=lambda j: -sum(f.size or 0 for f in j[1].files))
    out: dict[int, tuple[Path, str, int]] = {}
    with ThreadPoolExecutor(WORKERS) as pool, ThreadPoolExecutor(WORKERS) as ahead:
        futures = {pool.submit(rebuild_wheel, vault, man, python, wheel_dir, ahead=ahead): i for i, man in order}
        failure: BaseException | None = None
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                out[i] = fut.result()
            except BaseException as err:  # the others finish or are cancelled; the first error is raised
                if failure is None:
                    failure = err
                    for other in futures:
                        other.cancel()
                continue
            if not existed[i]:
                made.append(out[i][0])
        if failure is not None:
            raise failure
    return out


def _lock_only_entries(vault: Vault, sid: str, doc: Snapshot, wheel_dir: Path, base: Path, wheels: bool):
    """A lock-only snapshot's packages from stored copies of their builds, else recorded URLs
    (``envvault.lock.sources``, the rule restore uses too)."""

    sources = resolve_sources(vault, doc, copies=wheels)
    warnings = [w for s in sources for w in [describe(s)] if w]
    warnings += [f"{s.package.name} {s.package.version}: no stored copy of its build and no recorded URL; "
                 "the lock names it without a source" for s in sources if not s.known]
    return pylock_entries(vault, sid, doc, sources, wheel_dir, base), warnings

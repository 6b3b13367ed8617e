"""``restore --into NEW_PATH``: a fresh venv built from the snapshot.

uv makes the venv with the snapshot's Python and installs the wheels that ``export`` would rebuild from the
vault, offline and without dependency resolution, so console-script launchers are written for the new
interpreter. Files that were edited in place or deleted when the snapshot was taken are then put back in
that state (bytes and RECORD rows), so the new environment has the snapshot's state ids. Last, each
distribution's provenance files (``INSTALLER``, ``REQUESTED``, ``direct_url.json``, ``uv_cache.json``) and the
pyvenv.cfg settings that change behaviour are made as the snapshot recorded them: uv's own (a
``direct_url.json`` naming the scratch wheel, ``REQUESTED`` on every package) would rewrite history. The
verification compares them too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path, PurePosixPath

from envvault.diff import current_document, diff_snapshots
from envvault.errors import RefusedError
from envvault.model.manifest import DistManifest
from envvault.model.record import format_record
from envvault.model.snapshot import PackageSummary, PythonInfo, Snapshot
from envvault.restore.installed import find_dist_info, read_record, reapply_state, replace_file
from envvault.restore.result import RestoreResult
from envvault.restore.uv import (
    make_venv,
    refuse_nonempty,
    check_lock_sources,
    resolve_lock_sources,
    run_uv,
    scratch_dir,
    sync_from_lock,
)

__all__ = ["restore_into"]


def restore_into(vault, sid: str, snapshot: Snapshot, dest: Path, *, backup: bool = False, dry_run: bool,
                 progress=None) -> RestoreResult:
    """Build a new venv at ``dest`` holding snapshot ``sid`` (a ``result.Strategy``; ``backup`` has nothing
    to back up: the folder is new or empty)."""
    if (dest / "pyvenv.cfg").exists() or (dest / "bin" / "python").exists():
        raise RefusedError(f"{dest} is already an environment; --into builds a new one (restore in place with --venv)")
    refuse_nonempty(dest)
    packages = snapshot.packages
    python = snapshot.python
    names = [f"{p.name} {p.version}" for p in packages]
    # A lock-only snapshot's sources are decided first (fast): a dry run says what the restore would say.
    sources = check_lock_sources(vault, sid, snapshot) if snapshot.lock_only else None
    if dry_run:
        return RestoreResult(sid, str(dest), "into", None, len(packages), False, True,
                             plan={"python": python.version, "install": names})
    warnings: list[str] = []
    created = not dest.exists()
    with vault.lock(), scratch_dir(vault) as work:
        lock_entries = None
        manifests: dict[str, DistManifest] = {}
        wheels: list[Path] = []
        if snapshot.lock_only:
            lock_entries = resolve_lock_sources(vault, sid, snapshot, work, sources)
        else:
            wheels = _rebuild_all(vault, python, packages, work / "wheels", manifests, warnings, progress)
        venv_warning = make_venv(dest, python)
        if venv_warning:
            warnings.append(venv_warning)
        try:
            python_exe = dest / "bin" / "python"
            if lock_entries is not None:
                sync_from_lock(sid, snapshot, lock_entries, python_exe, reinstall=[], work=work)
            elif wheels:
                # A throwaway cache beside the wheels: uv then links files into the venv instead of copying
                # twice (measured: 5 s instead of 15 s for a torch venv with --no-cache). Never symlinks: that
                # cache is deleted when the restore ends.
                run_uv("pip", "install", "--python", str(python_exe), "--offline", "--no-index", "--no-deps",
                       "--cache-dir", str(work / "uv-cache"), "--link-mode", "hardlink", "--quiet", *map(str, wheels),
                       what=f"install the snapshot's wheels into {dest}")
            for p in packages:
                man = manifests.get(p.manifest)
                if man is not None and (p.modified or p.missing):
                    reapply_state(vault, dest, python, man)
            provenance = _provenance_of(vault, packages, manifests)
            for di, wanted in provenance:
                _apply_provenance(dest, python, di, wanted)
            pyvenv = _pyvenv_wanted(python)
            _apply_pyvenv(dest, pyvenv)
        except BaseException:
            if created:
                shutil.rmtree(dest, ignore_errors=True)
            raise
    after = current_document(vault, dest, facts=False)
    remaining = diff_snapshots(after, snapshot, vault=vault, old_label=str(dest), new_label=sid[:12], scope="environment")
    python_ok = not any(k in remaining.python for k in ("implementation", "abi", "soabi", "platform"))
    for k, (o, n) in remaining.python.items():
        warnings.append(f"python {k} is {o}, the snapshot had {n}")
    differs = _provenance_differences(dest, python, provenance) + _pyvenv_differences(dest, pyvenv)
    warnings.extend(differs)
    verified = remaining.packages_empty and python_ok and not differs
    return RestoreResult(
        sid, str(dest), "into", None, len(packages), verified, False,
        written_files=sum(p.files for p in packages), written_bytes=sum(p.size for p in packages),
        plan={"python": python.version, "install": names},
        remaining=None if remaining.packages_empty else remaining.to_json(), warnings=tuple(warnings),
    )


def _rebuild_all(vault, python: PythonInfo, packages: tuple[PackageSummary, ...], wheel_dir: Path,
                 manifests: dict[str, DistManifest], warnings: list, progress) -> list[Path]:
    from envvault.lock.wheels import rebuild_wheel

    wheel_dir.mkdir(parents=True, exist_ok=True)
    out, done = [], 0
    for p in packages:
        if p.record != "ok" or not vault.has(p.manifest):
            warnings.append(f"{p.name} {p.version}: its files are not in the vault (installed without RECORD); not installed")
            continue
        man = vault.load_manifest(p.manifest)  # refuses paths that leave the environment
        _check_links(p, man)
        manifests[p.manifest] = man
        path, _sha, _size = rebuild_wheel(vault, man, python, wheel_dir)
        out.append(path)
        done += p.size
        if progress:
            progress(done)
    return out


def _check_links(p: PackageSummary, man: DistManifest) -> None:
    """The same refusal as in place: a symlink that may lead out of the environment stops the restore
    (the manifest's parser has refused paths and RECORD paths that leave it)."""
    bad = [f"files[{i}].path {f.path!r} is a symlink that may lead out of the environment"
           for i, f in enumerate(man.files) if f.link is not None and (f.link.startswith("/") or ".." in f.link.split("/"))]
    if bad:
        raise RefusedError(f"refusing to restore {p.name} {p.version}: " + "; ".join(bad[:10]))


# -- provenance and pyvenv.cfg: as the snapshot recorded them ------------------------------------------------

# The dist-info files an installer writes about the install itself (docs/format.md, "generated row").
PROVENANCE_FILES = ("INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json")
# pyvenv.cfg keys that change how the environment behaves; the others describe the interpreter found.
PYVENV_KEYS = ("include-system-site-packages", "prompt")


def _wanted_provenance(vault, man: DistManifest) -> dict[str, tuple[bytes | None, bool]]:
    """``{file: (bytes or None for absent, listed in RECORD)}`` for the files whose state is known: the stored
    bytes (full snapshots), else what the manifest says (lock-only: installer, requested, direct_url)."""
    di = PurePosixPath(man.dist_info or "").name
    rows = {f.record: f for f in man.files}
    out: dict[str, tuple[bytes | None, bool]] = {}
    for name in PROVENANCE_FILES:
        f = rows.get(f"{di}/{name}")
        listed = f is not None
        if listed and f.state == "missing":
            out[name] = (None, False)
        elif listed and f.chunks is not None:
            out[name] = (b"".join(bytes(vault.get(c)) for c in f.chunks), True)
        elif name == "INSTALLER":
            out[name] = (f"{man.installer}\n".encode() if man.installer else None, listed)
        elif name == "REQUESTED":
            out[name] = (b"" if man.requested else None, listed)
        elif name == "direct_url.json":
            du = man.direct_url
            ok = du is not None and "unparsable" not in du
            out[name] = (json.dumps(dict(du), sort_keys=True).encode() if ok else None, listed)
        elif not listed:
            out[name] = (None, False)  # uv_cache.json: absent; recorded but not stored: left as written
    return out


def _provenance_of(vault, packages: tuple[PackageSummary, ...], manifests: dict[str, DistManifest]) -> list[tuple[str, dict]]:
    out = []
    for p in packages:
        man = manifests.get(p.manifest)
        if man is None and p.record == "ok" and vault.has(p.manifest):
            man = vault.load_manifest(p.manifest)  # lock-only: installed from a lock, manifests not loaded yet
        if man is not None and (man.dist_info or "").endswith(".dist-info"):
            out.append((PurePosixPath(man.dist_info).name, _wanted_provenance(vault, man)))
    return out


def _record_row(rel: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [rel, f"sha256={digest}", str(len(data))]


def _apply_provenance(dest: Path, python: PythonInfo, di: str, wanted: dict) -> None:
    """Write (or remove) the provenance files and put their RECORD rows as the snapshot had them."""
    folder = find_dist_info(dest, python, di)
    if folder is None:
        return
    record_path = folder / "RECORD"
    rows = read_record(record_path.read_text(encoding="utf-8"))
    for name, (data, listed) in wanted.items():
        target = folder / name
        if data is None:
            try:
                os.unlink(target)
            except FileNotFoundError:
                pass
        else:
            replace_file(target, data)
        rel = f"{folder.name}/{name}"
        rows = [r for r in rows if r[0] != rel]
        if data is not None and listed:
            at = next((i for i, r in enumerate(rows) if r[0] == f"{folder.name}/RECORD"), len(rows))
            rows.insert(at, _record_row(rel, data))
    replace_file(record_path, format_record(rows).encode("utf-8"))


def _provenance_differences(dest: Path, python: PythonInfo, provenance: list[tuple[str, dict]]) -> list[str]:
    out = []
    for di, wanted in provenance:
        folder = find_dist_info(dest, python, di)
        if folder is None:
            out.append(f"{di}: not installed")
            continue
        for name, (data, _listed) in wanted.items():
            try:
                found = (folder / name).read_bytes()
            except FileNotFoundError:
                found = None
            if found != data:
                out.append(f"{di}/{name} differs from the snapshot's")
    return out


def _pyvenv_wanted(python: PythonInfo) -> dict[str, str | None]:
    """The settings to reproduce: each of ``PYVENV_KEYS`` as recorded (None: absent); nothing when the
    snapshot recorded no pyvenv.cfg. A missing include-system-site-packages means false."""
    cfg = python.pyvenv_cfg
    if not cfg:
        return {}
    wanted = {k: cfg.get(k) for k in PYVENV_KEYS}
    wanted["include-system-site-packages"] = (wanted["include-system-site-packages"] or "false").lower()
    return wanted


def _read_pyvenv(dest: Path) -> tuple[list[str], dict[str, str]]:
    lines = (dest / "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    return lines, {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in lines) if _}


def _apply_pyvenv(dest: Path, wanted: dict) -> None:
    if not wanted:
        return
    lines, _ = _read_pyvenv(dest)
    kept = [ln for ln in lines if ln.partition("=")[0].strip() not in wanted]
    kept += [f"{k} = {v}" for k, v in wanted.items() if v is not None]
    replace_file(dest / "pyvenv.cfg", ("\n".join(kept) + "\n").encode("utf-8"))


def _pyvenv_differences(dest: Path, wanted: dict) -> list[str]:
    _, found = _read_pyvenv(dest)
    return [f"pyvenv.cfg {k} is {found.get(k)!r}, the snapshot had {v!r}" for k, v in wanted.items()
            if found.get(k) != v]

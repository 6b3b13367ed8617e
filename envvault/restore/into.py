"""``restore --into NEW_PATH``: a fresh venv built from the snapshot.

uv makes the venv with the snapshot's Python; every stored file of every distribution is then written
straight from the vault into it through the one materializer (``envvault/materialize.py``: pack order,
parallel, BLAKE3 per object and sha256 per file checked, temp names, then renames), as an installer of the
wheel ``export`` would rebuild writes it. Only what an installer generates is made afresh: scripts-folder
files with a python shebang (console-script launchers and ``<name>.data/scripts/`` files) get the new
interpreter's, and RECORD is the snapshot's with those rows rehashed and the rows of bytecode it does not
write dropped. Files that were edited in place or deleted when the snapshot was taken are written (or left
out) as stored, their RECORD rows as the snapshot had them, so the new environment has the snapshot's state
ids. Each distribution's provenance files (``INSTALLER``, ``REQUESTED``, ``direct_url.json``,
``uv_cache.json``) and the pyvenv.cfg settings that change behaviour are made as the snapshot recorded them,
and the verification compares them too. The stat cache learns every file written, so the verification (and
the next ``status``) stats files instead of re-reading them. A lock-only snapshot is installed by uv from a
generated lock (``uv.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import marshal
import os
import shutil
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator

from envvault import materialize
from envvault.diff import diff_snapshots
from envvault.snap import scan_current, statcache_for
from envvault.errors import EnvironmentProblem, RefusedError
from envvault.journal import exclusive_target
from envvault.materialize import FileSpec, Staged
from envvault.lock.wheels import dist_layout
from envvault.model.identity import LAUNCHER_HEAD, is_bytecode, is_script
from envvault.model.manifest import DistManifest
from envvault.model.record import RecordEntry, format_record, record_sha256
from envvault.model.snapshot import PackageSummary, PythonInfo, Snapshot
from envvault.restore.managed import refuse_uncopyable, venv_manifest, venv_view
from envvault.restore.pyvenv import apply_settings, pyvenv_wanted, settings_differences
from envvault.restore.installed import (find_dist_info, installed_script, read_record, replace_file,
                                        stored_record)
from envvault.restore.result import RestoreResult
from envvault.vault import timing
from envvault.vault.fsutil import makedirs_recording
from envvault.vault.store import ObjectReader
from envvault.restore.uv import (
    make_venv,
    refuse_nonempty,
    check_lock_sources,
    resolve_lock_sources,
    scratch_dir,
    sync_from_lock,
)

__all__ = ["restore_into", "refuse_inside"]


def refuse_inside(dest: Path, vault) -> None:
    """A RefusedError when ``dest`` (links followed) lies inside a venv (a folder above it holds
    ``pyvenv.cfg``: the new venv's files would be the old one's, importable from its site-packages, and
    every scan of it would walk them) or inside a vault in a folder (whose folders are the vault's own)."""
    real = Path(os.path.realpath(dest))
    for parent in real.parents:
        if (parent / "pyvenv.cfg").is_file():
            raise RefusedError(f"{dest} lies inside the environment {parent}; --into builds a new venv: "
                               "choose a folder outside it")
    if vault.local:
        root = Path(os.path.realpath(vault.backend.root))
        if real == root or root in real.parents:
            raise RefusedError(f"{dest} lies inside the vault {vault.backend.root}; --into builds a new venv: "
                               "choose a folder outside it")


def restore_into(vault, sid: str, snapshot: Snapshot, dest: Path, *, backup: bool = False, dry_run: bool,
                 progress=None, remember=None) -> RestoreResult:
    """Build a new venv at ``dest`` holding snapshot ``sid`` (a ``result.Strategy``; ``backup`` has nothing
    to back up: the folder is new or empty)."""
    if (dest / "pyvenv.cfg").exists() or (dest / "bin" / "python").exists():
        raise RefusedError(f"{dest} is already an environment; --into builds a new one (restore in place with --venv)")
    refuse_inside(dest, vault)
    refuse_nonempty(dest)
    snapshot = venv_view(snapshot, vault.load_manifest)  # a system environment's, as a venv holds it (restore/managed.py)
    refuse_uncopyable(snapshot, vault.has)  # system packages without stored files: --system-site-packages
    packages = snapshot.packages
    python = snapshot.python
    names = [f"{p.name} {p.version}" for p in packages]
    # A lock-only snapshot's sources are decided first (fast): a dry run says what the restore would say.
    sources = check_lock_sources(vault, sid, snapshot) if snapshot.lock_only else None
    if dry_run:
        return RestoreResult(sid, str(dest), "into", None, len(packages), False, True,
                             plan={"python": python.version, "install": names})
    warnings: list[str] = []
    staged: list[Staged] = []
    with vault.lock(), exclusive_target(vault, dest), scratch_dir(vault) as work:
        vault.snapshot_still_there(sid)  # a gc it waited for may have deleted it (its manifests with it)
        lock_entries = None
        planned: list[tuple[list[FileSpec], tuple[str, dict] | None]] = []  # a full snapshot's (_plan_all)
        if snapshot.lock_only:
            lock_entries = resolve_lock_sources(vault, sid, snapshot, work, sources)
        else:
            vault.prefetch(p.manifest for p in packages)  # a bucket's packs come side by side (vault/s3.py)
            stored = []
            for p in packages:
                if p.record != "ok" or not vault.has(p.manifest):
                    warnings.append(f"{p.name} {p.version}: its files are not in the vault (installed without "
                                    "RECORD); not installed")
                    continue
                stored.append(p)
            # every manifest read (its paths checked) and every file decided before the venv is made
            t0 = timing.clock()
            planned = _plan_all(vault, stored, python, str(dest / (python.scripts or "bin") / "python"))
            if timing.ON:
                timing.add("into: every distribution planned (manifests read and checked, files decided)", t0)
        created = _claim(dest)  # what a failure may remove: decided now, under the lock, not before the wait
        with _removed_on_failure(dest, created):  # from the venv's making on: a stop leaves no bare venv
            t0 = timing.clock()
            venv_warning = make_venv(dest, python)
            if timing.ON:
                timing.add("into: the venv made (uv venv)", t0)
            if venv_warning:
                warnings.append(venv_warning)
            python_exe = dest / "bin" / "python"
            if lock_entries is not None:  # (an edited stored copy's RECORD rows are put back by sync_from_lock)
                sync_from_lock(sid, snapshot, lock_entries, python_exe, reinstall=[], work=work)
                provenance = _provenance_of(vault, packages)
            else:
                provenance = [wanted for _specs, wanted in planned if wanted is not None]
            if planned:
                t0 = timing.clock()
                staged = _write_all(vault, sid, python, dest, [s for specs, _w in planned for s in specs], progress)
                if timing.ON:
                    timing.add("into: every file written (folders, materializer, launchers)", t0)
            else:
                for di, wanted in provenance:
                    _apply_provenance(dest, python, di, wanted)
            pyvenv = pyvenv_wanted(python)
            apply_settings(dest, pyvenv)
            # The new venv's stat cache starts empty (an earlier venv's at this path says nothing of its files)
            # and holds what was written; the verification scan takes it from memory and saves it.
            cache = statcache_for(vault, dest, fresh=True)
            if staged:
                from envvault.restore.apply import populate_statcache

                t0 = timing.clock()
                populate_statcache(vault, dest, staged, cache)  # the verification stats, never re-reads
                if timing.ON:
                    timing.add("into: the stat cache told what was written", t0)
    t0 = timing.clock()
    with _removed_on_failure(dest, created):  # the verification too: a failure leaves no half-built venv
        after = scan_current(vault, dest, facts=False, cache=cache)
        remaining = diff_snapshots(after, snapshot, vault=vault, old_label=str(dest), new_label=sid[:12],
                                   scope="environment")
        differs = _provenance_differences(dest, python, provenance) + settings_differences(dest, pyvenv)
    if timing.ON:
        timing.add("into: verification (scan, compare)", t0)
    python_ok = not any(k in remaining.python for k in ("implementation", "abi", "soabi", "platform"))
    for k, (o, n) in remaining.python.items():
        warnings.append(f"python {k} is {o}, the snapshot had {n}")
    warnings.extend(differs)
    verified = remaining.packages_empty and python_ok and not differs
    if remember is not None and verified and remaining.empty:  # the verification saved the new venv's cache
        remember(cache)
    return RestoreResult(
        sid, str(dest), "into", None, len(packages), verified, False,
        written_files=len(staged) if staged else sum(p.files for p in packages),
        written_bytes=sum(st.spec.size for st in staged) if staged else sum(p.size for p in packages),
        plan={"python": python.version, "install": names},
        remaining=None if remaining.packages_empty else remaining.to_json(), warnings=tuple(warnings),
    )


def _claim(dest: Path) -> bool:
    """Make ``dest`` this restore's, under its restore lock, before anything is written: made here (True), or
    an empty folder as it was found (False; one that was already there). A RefusedError when another program
    made an environment or files there while this restore waited for the vault lock (helper 23: a venv a user
    made meanwhile was removed when uv then failed on it, as if this restore had made it)."""
    for parent in (dest.parent, *dest.parent.parents):
        if os.path.lexists(parent):
            if not parent.is_dir():
                why = " (a symlink to a missing one)" if parent.is_symlink() else ""
                raise RefusedError(f"{parent} is not a folder{why}; --into cannot make {dest} under it")
            break
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(dest)
        return True
    except FileExistsError:
        pass
    if (dest / "pyvenv.cfg").exists() or (dest / "bin" / "python").exists():
        raise RefusedError(f"{dest} became an environment while this restore waited for the vault lock; "
                           "nothing was changed; choose another folder")
    refuse_nonempty(dest)
    return False


@contextmanager
def _removed_on_failure(dest: Path, created: bool) -> Iterator[None]:
    """Remove the half-built venv at ``dest`` if the body fails (Ctrl-C and SIGTERM included): the folder, when
    this restore created it, else everything in it (it was empty: ``refuse_nonempty``)."""
    try:
        yield
    except BaseException:
        if created:
            shutil.rmtree(dest, ignore_errors=True)
        else:
            for entry in os.scandir(dest) if dest.is_dir() else ():
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        pass
        raise


def _plan_all(vault, packages: list[PackageSummary], python: PythonInfo,
              exe: str) -> list[tuple[list[FileSpec], tuple[str, dict] | None]]:
    """For each of ``packages`` (stored), in order: its files as the new venv at ``exe``'s gets them
    (``_specs_of``) and its provenance (dist-info folder name, ``_wanted_provenance``; None for an egg-info).
    Its manifest is read and checked first (a RefusedError for a path or symlink that leaves the environment,
    a CorruptError for a damaged one). Reading 197 manifests of 49,405 files and deciding each file is Python
    work a file (2 s of the GPU host's 6 s ``--into``, bench/results/gpu_into_pyspy_*.txt), so a vault in a
    folder shares it out to forked children (``forked.map_all``, which answers here whatever a child does
    not: an error is raised here as it would be without children); each answers in plain values
    (``marshal``), made into records here."""
    reader = ObjectReader(vault)

    def plan(p: PackageSummary) -> tuple[list[FileSpec], tuple[str, dict] | None]:
        man = vault.load_manifest(p.manifest)  # refuses paths that leave the environment
        if p.site is not None:  # a system environment's: its paths as the venv holds them
            man = venv_manifest(man, python)
        _check_links(p, man)
        wanted = None
        if (man.dist_info or "").endswith(".dist-info"):
            wanted = (PurePosixPath(man.dist_info).name, _wanted_provenance(vault, man))
        return _specs_of(reader, p, man, python, exe, wanted[1] if wanted else None), wanted

    if not vault.local:
        return [plan(p) for p in packages]
    from envvault.vault.forked import map_all

    def answer(p: PackageSummary) -> bytes:
        specs, wanted = plan(p)
        return marshal.dumps(([(s.path, s.chunks, s.size, s.sha256, s.mode, s.link, s.owner, s.data) for s in specs],
                              wanted))

    out = []
    for got in map_all(answer, packages, [max(1, int(p.files)) for p in packages]):
        specs, wanted = marshal.loads(got)  # from this process's own children, never from a vault
        out.append(([FileSpec(*fields) for fields in specs], wanted))
    return out


def _write_all(vault, sid: str, python: PythonInfo, dest: Path, specs: list[FileSpec], progress) -> list[Staged]:
    """Write ``specs`` (``_plan_all``) into the new venv at ``dest`` (see the module doc); returns what was
    written, in place."""
    t0 = timing.clock()
    reader = ObjectReader(vault)
    # Every entry decided against the tree as the restore leaves it, before anything is written into it.
    materialize.refuse_escapes(dest, f"refusing to restore {sid[:12]}",
                               links={s.path: s.link for s in specs if s.link is not None},
                               entries=[s.path for s in specs if s.link is None], where="the new environment",
                               scripts={"bin", python.scripts if isinstance(python.scripts, str) else "bin"})
    if progress is not None:
        progress.set_total(sum(s.size for s in specs))
    if timing.ON:
        timing.add("into: every path checked against the final tree", t0)
    # The venv is new and nothing imports from it yet: files go straight under their final names, as an
    # installer's would (no temp name, no rename), each folder made by the writer that first needs it; a
    # failure removes the whole venv (the caller).
    return materialize.stage(reader, dest, specs, materialize.FINAL_NAME, progress=progress, folders=_make_folder)


def _make_folder(path: str) -> None:
    """``mkdir -p`` for a writer of the new venv (``materialize.stage``'s ``folders``); a file in the way is
    one clear line."""
    makedirs_recording(path, [], lambda q: EnvironmentProblem(f"{q} is in the way of the new venv"))


def _specs_of(reader, p: PackageSummary, man: DistManifest, python: PythonInfo, exe: str,
              wanted: dict | None) -> list[FileSpec]:
    """The files of one distribution as an installer of its wheel leaves them (see the module doc)."""
    def stored(f) -> bytes:
        return materialize.stored_bytes(reader, f, f"{p.name} {p.version}")

    layout = dist_layout(man, python)
    di = man.dist_info_name or ""
    record_rel = f"{di}/RECORD"
    specs: list[FileSpec] = []
    rehashed: dict[str, list[str]] = {}
    record_entry = None
    for f in man.files:
        if f.record == record_rel:
            record_entry = f
        elif f.link is not None:
            specs.append(FileSpec(f.path, link=f.link, owner=p.name))
        elif f.chunks is None:
            continue  # bytecode (never stored), a file missing at snapshot time, or not stored
        elif f.chunks and is_script(f.record, layout) and installed_script(
                head := bytes(reader.get(f.chunks[0])[:LAUNCHER_HEAD]), exe) is not head:
            data = installed_script(stored(f), exe)
            sha = record_sha256(hashlib.sha256(data).digest())
            specs.append(FileSpec(f.path, (), len(data), sha, f.mode or 0o755, None, p.name, data))
            rehashed[f.record] = RecordEntry(f.record, "sha256", sha, len(data)).to_row()
        else:
            specs.append(FileSpec(f.path, tuple(f.chunks), int(f.size or 0), f.sha256, f.mode or 0o644, None, p.name))
    written = {s.path for s in specs}
    folder = PurePosixPath(man.dist_info or "")
    for name, (data, _listed) in (wanted or {}).items():
        path = str(folder / name)
        if data is not None and path not in written:  # recorded, but not as a RECORD file (lock facts)
            specs.append(FileSpec(path, (), len(data), None, 0o644, None, p.name, data))
    if record_entry is not None and record_entry.chunks is not None:
        rows = stored_record(reader, record_entry, f"{p.name} {p.version}")
    else:  # not stored: the rows the manifest recorded
        rows = [[f.record, f"sha256={f.sha256}" if f.sha256 else "", "" if f.size is None else str(f.size)]
                for f in man.files]
    written_records = {f.record for f in man.files if f.chunks is not None or f.link is not None}
    rows = [rehashed.get(r[0], r) for r in rows if not (is_bytecode(r[0]) and r[0] not in written_records)]
    if wanted:
        rows = _provenance_rows(rows, folder.name, wanted)
    data = format_record(rows).encode("utf-8")
    mode = record_entry.mode if record_entry is not None and record_entry.mode else 0o644
    specs.append(FileSpec(str(folder / "RECORD"), (), len(data), None, mode, None, p.name, data))
    return specs


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
            out[name] = (materialize.stored_bytes(vault, f, f"{man.name} {man.version}"), True)
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


def _provenance_of(vault, packages: tuple[PackageSummary, ...]) -> list[tuple[str, dict]]:
    """A lock-only snapshot's provenance files, as its manifests recorded them (uv installed the packages)."""
    out = []
    for p in packages:
        if p.record == "ok" and vault.has(p.manifest):
            man = vault.load_manifest(p.manifest)
            if (man.dist_info or "").endswith(".dist-info"):
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
    for name, (data, _listed) in wanted.items():
        target = folder / name
        if data is None:
            try:
                os.unlink(target)
            except FileNotFoundError:
                pass
        else:
            replace_file(target, data)
    replace_file(record_path, format_record(_provenance_rows(rows, folder.name, wanted)).encode("utf-8"))


def _provenance_rows(rows: list[list[str]], folder: str, wanted: dict) -> list[list[str]]:
    """RECORD ``rows`` with the provenance files' rows as the snapshot had them: a row for each file that
    exists and was listed (before RECORD's own row), none for the others."""
    for name, (data, listed) in wanted.items():
        rel = f"{folder}/{name}"
        rows = [r for r in rows if r[0] != rel]
        if data is not None and listed:
            at = next((i for i, r in enumerate(rows) if r[0] == f"{folder}/RECORD"), len(rows))
            rows.insert(at, _record_row(rel, data))
    return rows


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

"""The uv adapter: find uv and a matching Python, make venvs, install rebuilt wheels, and restore lock-only
snapshots from their lockfile.

uv is the only installer envvault drives. It is called with explicit ``--python`` and never reads the
caller's active venv (``VIRTUAL_ENV`` is dropped from its environment).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Iterator

from envvault.terminate import OWN_SESSION, held
from envvault.errors import EnvironmentProblem, NotFoundError, RefusedError, UsageError
from envvault.model.snapshot import PythonInfo, Snapshot, loose_snapshot
from envvault.restore.installed import reapply_state
from envvault.restore.result import RestoreResult

__all__ = ["find_uv", "run_uv", "find_python", "make_venv", "restore_lock_only",
           "check_lock_sources", "resolve_lock_sources", "sync_from_lock", "scratch_dir", "refuse_nonempty"]


def find_uv() -> str:
    """uv on PATH, else next to this interpreter, else the ``uv`` Python package's binary."""
    found = shutil.which("uv")
    if found:
        return found
    beside = Path(sys.executable).parent / "uv"
    if beside.exists():
        return str(beside)
    try:
        import uv  # type: ignore[import-not-found]

        return uv.find_uv_bin()
    except ImportError:
        raise NotFoundError("uv is needed for this restore and was not found; install it (pip install uv)") from None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME")}
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")  # a restore never downloads an interpreter behind your back
    return env


def run_uv(*args: str, what: str) -> subprocess.CompletedProcess:
    """Run uv; on failure raise ``EnvironmentProblem`` with uv's last meaningful error lines. A SIGTERM while
    it runs waits for it (``terminate.held``)."""
    cmd = [find_uv(), *map(str, args)]
    try:
        with held():  # uv is never killed mid-install by a SIGTERM: it is raised once uv is done
            out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), stdin=subprocess.DEVNULL,
                                 **OWN_SESSION)
    except OSError as err:
        raise EnvironmentProblem(f"cannot run uv for {what}: {err}") from None
    if out.returncode != 0:
        lines = [ln.strip() for ln in out.stderr.strip().splitlines() if ln.strip()]
        detail = " / ".join(lines[-4:]) or f"exit status {out.returncode}"
        raise EnvironmentProblem(f"uv failed to {what}: {detail}")
    return out


def _version_of(exe: Path) -> str | None:
    try:
        out = subprocess.run([str(exe), "-I", "-c", "import sys;print('%d.%d.%d' % sys.version_info[:3])"],
                             capture_output=True, text=True, timeout=30, **OWN_SESSION)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def find_python(python: PythonInfo) -> tuple[str, str | None]:
    """An interpreter for the snapshot's Python: (path, warning or None). Exact version first (pyenv's, then
    uv's discovery), else the same minor version with a warning; ``NotFoundError`` naming the version when
    there is none. The snapshot names only the version, checked to be one: a snapshot may be anyone's, so no
    program it names (its ``base_prefix``, a version that is a path) is ever run to ask its version."""
    version = python.exact_version()
    minor = ".".join(version.split(".")[:2])
    names = [f"python{minor}", "python3", "python"]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions" / version / "bin"
    candidates = [pyenv / n for n in names]
    for exe in candidates:
        if exe.exists() and _version_of(exe) == version:
            return str(exe), None
    for request, exact in ((version, True), (minor, False)):
        try:
            out = run_uv("python", "find", "--no-project", request, what=f"find Python {request}")
        except EnvironmentProblem:
            continue
        exe = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
        got = _version_of(Path(exe)) if exe else None
        if got == version or (not exact and got and got.startswith(minor + ".")):
            return exe, None if got == version else f"Python {version} not found; using {got} (same minor version)"
    raise NotFoundError(
        f"no Python {version} is available to build the new environment; install it "
        f"(for example `uv python install {version}`) and run again"
    )


def make_venv(path: Path, python: PythonInfo) -> str | None:
    """``uv venv`` at ``path`` with the snapshot's Python; returns a warning when only the minor matched."""
    exe, warning = find_python(python)
    run_uv("venv", "--quiet", "--no-project", "--python", exe, str(path), what=f"create a venv at {path}")
    return warning


@contextmanager
def scratch_dir(vault) -> Iterator[Path]:
    """A temporary folder under the vault's ``tmp/`` (same filesystem as the packs), removed afterwards."""
    with vault.state.scratch_dir("restore-") as path:
        yield path


# -- lock-only snapshots ---------------------------------------------------------------------------


def _unknown(sources) -> list[str]:
    return [f"{s.package.name} {s.package.version}" for s in sources if not s.known]


def check_lock_sources(vault, sid: str, snapshot: Snapshot):
    """The sources of a lock-only snapshot's packages, decided from snapshot documents alone (fast);
    ``NotFoundError`` (exit 4) listing every package without one, before anything slow or any change."""
    from envvault.lock.sources import resolve_sources

    sources = resolve_sources(vault, snapshot)
    unknown = _unknown(sources)
    if unknown:
        raise NotFoundError(
            f"snapshot {sid[:12]} is lock-only and these packages have no known source (no stored copy of "
            f"their build, no recorded URL): {', '.join(unknown)}"
        )
    return sources


def _write_pylock(snapshot: Snapshot, entries: list[dict], out: Path) -> None:
    import tomli_w

    from envvault.lock.export import pylock_document

    lock = pylock_document(snapshot, entries)
    minor = ".".join((snapshot.python.version or "").split(".")[:2])
    lock["requires-python"] = f"=={minor}.*"
    out.write_text(tomli_w.dumps(lock))


def resolve_lock_sources(vault, sid: str, snapshot: Snapshot, work: Path, sources=None) -> list[dict]:
    """Pylock entries for every package (wheels of stored copies rebuilt under ``work/pylock.wheels``; an
    entry from an edited copy carries ``reapply(prefix)``, which ``sync_from_lock`` calls). ``sources``:
    from ``check_lock_sources``, which runs first when not given (and fails before anything is rebuilt)."""
    from envvault.lock.sources import pylock_entries

    if sources is None:
        sources = check_lock_sources(vault, sid, snapshot)
    entries = pylock_entries(vault, sid, snapshot, sources, work / "pylock.wheels", work)
    for e in entries:  # an edited stored copy: after install, its RECORD rows go back to the build's
        copy = e["copy"]
        if copy is not None and copy.edited:
            e["reapply"] = partial(reapply_state, vault, python=snapshot.python, man=vault.load_manifest(copy.manifest))
    return entries


def sync_from_lock(sid: str, snapshot: Snapshot, entries: list[dict], python_exe: Path, *, reinstall: list[str], work: Path,
                   installed: set[str] | None = None) -> dict:
    """Write the snapshot's pylock.toml under ``work`` (beside ``pylock.wheels/``) and ``uv pip sync`` the
    interpreter's environment to it: offline when every package has a rebuilt wheel. Packages that came
    from an edited stored copy and that uv installed (``installed``: their names; None: all) then get the
    RECORD rows their build has, so they carry the snapshot's build id with the stored edits."""
    lock_path = work / "pylock.toml"
    _write_pylock(snapshot, entries, lock_path)
    offline = all(e["wheel"] is not None for e in entries)
    args = ["pip", "sync", "--preview-features", "pylock", "--python", str(python_exe), "--cache-dir",
            str(work / "uv-cache"), "--link-mode", "hardlink", "--quiet"]  # that cache is deleted afterwards
    if offline:
        args += ["--offline", "--no-index"]
    for name in reinstall:
        args += ["--reinstall-package", name]
    run_uv(*args, str(lock_path), what=f"sync {python_exe.parent.parent} to the lockfile of {sid[:12]}")
    for e in entries:
        if e.get("reapply") is not None and (installed is None or e["summary"].name in installed):
            e["reapply"](python_exe.parent.parent)
    return {"wheels": sum(1 for e in entries if e["wheel"]), "urls": sum(1 for e in entries if e["source"]),
            "offline": offline}


def restore_lock_only(vault, sid: str, snapshot: Snapshot, target: Path, *, backup: bool, dry_run: bool,
                      progress=None, remember=None) -> RestoreResult:
    """Restore a lock-only snapshot in place through uv. The sources of its packages are decided first
    (fast, from snapshot documents): a restore that cannot succeed fails before any slow work, and
    ``dry_run`` runs the same decision. Same-version build changes are forced with ``--reinstall-package``
    (uv judges by version alone). A lock-only snapshot recorded no file contents: a package is compared with
    the contents a full snapshot of its build recorded (``diff.content_states``; deleted or edited files then
    get it reinstalled), else at build level only. A ``result.Strategy`` (uv reports no progress)."""
    from envvault.diff import diff_snapshots
    from envvault.snap import scan_current
    from envvault.lock.sources import describe
    from envvault.restore.plan import check_python

    from envvault.env.probe import system_of

    if system_of(target) is not None or snapshot.python.system:
        # uv would sync the interpreter's whole site, the packages the system manages (apt) included
        raise UsageError(f"snapshot {sid[:12]} is lock-only (it recorded no file contents), and only a full "
                         f"snapshot restores the system environment at {target} in place; build a venv from it with "
                         f"`{vault.command('restore', sid[:12], '--into', 'NEW_PATH')}`")
    if not (target / "bin" / "python").exists():
        raise UsageError(f"{target} is not a Python environment; pass --venv PATH or use --into NEW_PATH")
    sources = check_lock_sources(vault, sid, snapshot)
    with vault.lock():
        vault.snapshot_still_there(sid)  # a gc it waited for may have deleted it
        now = loose_snapshot(scan_current(vault, target, facts=False))
        check_python(snapshot.python, now.python)
        plan = diff_snapshots(now, snapshot, vault=vault, old_label="current", new_label=sid[:12], scope="environment")
        reinstall = sorted({c.name for c in plan.changed if c.old_version == c.new_version})
        touched = {p.name for p in plan.added} | {c.name for c in plan.changed}
        warnings = tuple(w for s in sources if s.package.name in touched for w in [describe(s)] if w)
        planned = {"diff": plan.to_json(), "reinstall": reinstall, "sources": [_source_json(s) for s in sources
                                                                               if s.package.name in touched]}
        if dry_run or plan.packages_empty:
            return RestoreResult(sid, str(target), "lock", None, len(plan.changed) + len(plan.added) + len(plan.removed),
                                 plan.packages_empty and not dry_run, dry_run, plan=planned, warnings=warnings)
        backup_id = None
        with scratch_dir(vault) as work:
            entries = resolve_lock_sources(vault, sid, snapshot, work, sources)
            if backup:
                from envvault.restore.backup import take_backup

                backup_id = take_backup(vault, target, sid).id
            info = sync_from_lock(sid, snapshot, entries, target / "bin" / "python", reinstall=reinstall, work=work,
                                  installed=touched)
        after = loose_snapshot(scan_current(vault, target, facts=False))
        remaining = diff_snapshots(after, snapshot, vault=vault, old_label="current", new_label=sid[:12], scope="environment")
    written = [p for p in after.packages if p.name in touched]
    return RestoreResult(
        sid, str(target), "lock", backup_id, len(plan.changed) + len(plan.added) + len(plan.removed),
        remaining.packages_empty, False, plan={**planned, **info},
        written_files=sum(p.files for p in written), written_bytes=sum(p.size for p in written),
        remaining=None if remaining.packages_empty else remaining.to_json(), warnings=warnings,
    )


def _source_json(s) -> dict:
    p = s.package
    out = {"name": p.name, "version": p.version, "build_id": p.build_id}
    if s.copy is not None:
        out["from"] = {"snapshot": s.copy.snapshot, "manifest": s.copy.manifest,
                       "differs_from_record": list(s.copy.differs), "missing": list(s.copy.missing)}
    elif s.url is not None:
        out["from"] = {"url": s.url["url"]}
    return out


def refuse_nonempty(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise RefusedError(f"{path} exists and is not empty; --into needs a new or empty directory")

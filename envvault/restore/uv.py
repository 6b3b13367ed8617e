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
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from envvault.errors import EnvironmentProblem, NotFoundError, RefusedError, UsageError

__all__ = ["find_uv", "run_uv", "find_python", "make_venv", "restore_lock_only", "lock_sources",
           "resolve_lock_sources", "sync_from_lock", "scratch_dir", "refuse_nonempty"]


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
    """Run uv; on failure raise ``EnvironmentProblem`` with uv's last meaningful error lines."""
    cmd = [find_uv(), *map(str, args)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), stdin=subprocess.DEVNULL)
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
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def find_python(python: dict) -> tuple[str, str | None]:
    """An interpreter for the snapshot's Python: (path, warning or None). Exact version first (the
    snapshot's base interpreter, pyenv's, then uv's discovery), else the same minor version with a warning;
    ``NotFoundError`` naming the version when there is none."""
    version = python.get("version") or ""
    minor = ".".join(version.split(".")[:2])
    names = [f"python{minor}", "python3", "python"]
    candidates: list[Path] = []
    base = python.get("base_prefix")
    if base:
        candidates += [Path(base) / "bin" / n for n in names]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions" / version / "bin"
    candidates += [pyenv / n for n in names]
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


def make_venv(path: Path, python: dict) -> str | None:
    """``uv venv`` at ``path`` with the snapshot's Python; returns a warning when only the minor matched."""
    exe, warning = find_python(python)
    run_uv("venv", "--quiet", "--no-project", "--python", exe, str(path), what=f"create a venv at {path}")
    return warning


@contextmanager
def scratch_dir(vault) -> Iterator[Path]:
    """A temporary folder under the vault's ``tmp/`` (same filesystem as the packs), removed afterwards."""
    base = vault.root / "tmp"
    base.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="restore-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- lock-only snapshots ---------------------------------------------------------------------------


def _full_manifests_by_build(vault) -> dict[str, str]:
    """build_id -> manifest id of an unedited, fully stored copy of that build anywhere in the vault."""
    found: dict[str, str] = {}
    for s in vault.snapshots():
        if s.doc.get("lock_only"):
            continue
        for p in s.doc.get("packages") or ():
            b = p.get("build_id")
            if b and b not in found and p.get("state_id") == b and not p.get("missing") and p.get("record") == "ok" \
                    and vault.has(p.get("manifest", "")):
                found[b] = p["manifest"]
    return found


def lock_sources(vault, sid: str, doc: dict, wheel_dir: Path) -> tuple[list[dict], list[str]]:
    """For each package of a lock-only snapshot, where its exact build can come from: a wheel rebuilt from
    the same build stored by another snapshot, else the original URL + hash its installer recorded.
    Returns (pylock entries, packages with no known source)."""
    from envvault.lock.export import original_source
    from envvault.lock.wheels import rebuild_wheel

    builds = _full_manifests_by_build(vault)
    entries, unknown = [], []
    for p in doc.get("packages") or ():
        entry = {"summary": p, "snapshot": sid, "source": None, "wheel": None}
        mid = builds.get(p.get("build_id") or "")
        if mid is not None:
            wheel_dir.mkdir(parents=True, exist_ok=True)
            path, sha, size = rebuild_wheel(vault, vault.get_json(mid), doc["python"], wheel_dir)
            entry["wheel"] = {"name": path.name, "path": os.path.relpath(path, wheel_dir.parent), "size": size, "sha256": sha}
        else:
            man = vault.get_json(p["manifest"]) if p.get("manifest") and vault.has(p["manifest"]) else None
            src = original_source(man) if man else None
            if src and src.get("hashes") and src["url"].endswith(".whl"):
                entry["source"] = src
            else:
                unknown.append(f"{p['name']} {p['version']}")
        entries.append(entry)
    return entries, unknown


def _write_pylock(doc: dict, entries: list[dict], out: Path) -> None:
    import tomli_w

    from envvault.lock.export import pylock_document

    lock = pylock_document(doc, entries)
    minor = ".".join(doc["python"]["version"].split(".")[:2])
    lock["requires-python"] = f"=={minor}.*"
    out.write_text(tomli_w.dumps(lock))


def resolve_lock_sources(vault, sid: str, doc: dict, work: Path) -> list[dict]:
    """``lock_sources`` that raises ``NotFoundError`` listing every package without a known source."""
    entries, unknown = lock_sources(vault, sid, doc, work / "pylock.wheels")
    if unknown:
        raise NotFoundError(
            f"snapshot {sid[:12]} is lock-only and these packages have no known source (no stored copy of "
            f"their build, no recorded URL): {', '.join(unknown)}"
        )
    return entries


def sync_from_lock(sid: str, doc: dict, entries: list[dict], python_exe: Path, *, reinstall: list[str], work: Path) -> dict:
    """Write the snapshot's pylock.toml under ``work`` (beside ``pylock.wheels/``) and ``uv pip sync`` the
    interpreter's environment to it: offline when every package has a rebuilt wheel."""
    lock_path = work / "pylock.toml"
    _write_pylock(doc, entries, lock_path)
    offline = all(e["wheel"] is not None for e in entries)
    args = ["pip", "sync", "--preview-features", "pylock", "--python", str(python_exe), "--cache-dir",
            str(work / "uv-cache"), "--link-mode", "hardlink", "--quiet"]  # that cache is deleted afterwards
    if offline:
        args += ["--offline", "--no-index"]
    for name in reinstall:
        args += ["--reinstall-package", name]
    run_uv(*args, str(lock_path), what=f"sync {python_exe.parent.parent} to the lockfile of {sid[:12]}")
    return {"wheels": sum(1 for e in entries if e["wheel"]), "urls": sum(1 for e in entries if e["source"]),
            "offline": offline}


def restore_lock_only(vault, sid: str, doc: dict, target: Path, *, backup: bool, dry_run: bool):
    """Restore a lock-only snapshot in place through uv. Same-version build changes and edited files are
    forced with ``--reinstall-package`` (uv judges by version alone)."""
    from envvault.diff import current_document, diff_snapshots
    from envvault.restore.execute import RestoreResult
    from envvault.restore.plan import check_python

    if not (target / "bin" / "python").exists():
        raise UsageError(f"{target} is not a Python environment; pass --venv PATH or use --into NEW_PATH")
    with vault.lock():
        now = current_document(vault, target, facts=False)
        check_python(doc["python"], now["python"])
        plan = diff_snapshots(now, doc, old_label="current", new_label=sid[:12], scope="environment")
        reinstall = sorted({c.name for c in plan.changed if c.old_version == c.new_version})
        if dry_run or plan.packages_empty:
            return RestoreResult(sid, str(target), "lock", None, len(plan.changed) + len(plan.added) + len(plan.removed),
                                 plan.packages_empty and not dry_run, dry_run,
                                 plan={"diff": plan.to_json(), "reinstall": reinstall})
        backup_id = None
        with scratch_dir(vault) as work:
            # Resolve every source before touching anything: an unknown one fails the whole restore.
            entries = resolve_lock_sources(vault, sid, doc, work)
            if backup:
                from envvault.snap import take_snapshot

                backup_id = take_snapshot(vault, target, message=f"backup before restoring {sid[:12]}",
                                          trigger="restore-backup", argv=["envvault", "restore", sid]).id
            info = sync_from_lock(sid, doc, entries, target / "bin" / "python", reinstall=reinstall, work=work)
        after = current_document(vault, target, facts=False)
        remaining = diff_snapshots(after, doc, old_label="current", new_label=sid[:12], scope="environment")
    return RestoreResult(
        sid, str(target), "lock", backup_id, len(plan.changed) + len(plan.added) + len(plan.removed),
        remaining.packages_empty, False, plan={"diff": plan.to_json(), "reinstall": reinstall, **info},
        remaining=None if remaining.packages_empty else remaining.to_json(),
    )


def refuse_nonempty(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise RefusedError(f"{path} exists and is not empty; --into needs a new or empty directory")

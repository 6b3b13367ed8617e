"""Files a system package manager owns, held out of an in-place restore (docs/format.md, "Environment kinds").

In a system environment (an interpreter's own installation) some files belong to dpkg: rewriting or deleting
them would leave apt's database lying about the system. The plan of an in-place restore (``plan.make_plan``)
is therefore filtered here before anything is journalled or staged: every write, deletion, mode change and
dist-info removal of a managed file is dropped, and one warning per system package says what was left and
the command that restores it. pip- and uv-installed files stay in the plan, restored as in a venv. Pure but
for reading dpkg's file lists (``envvault.env.dpkg``).
"""

from __future__ import annotations

from envvault.model import records
import posixpath
from pathlib import Path
from typing import Sequence

from envvault.model.snapshot import Snapshot
from envvault.restore.plan import CurrentDist, Plan

__all__ = ["hold_managed", "install_areas", "share_system_packages", "venv_view", "venv_manifest",
           "refuse_uncopyable"]


def hold_managed(plan: Plan, target: Path, now: Snapshot, snapshot: Snapshot,
                 current: Sequence[CurrentDist]) -> Plan:
    """``plan`` without the changes to system-managed files; the plan itself for a venv."""
    if not (now.python.system or snapshot.python.system):
        return plan
    from envvault.env.dpkg import owners_under

    root = str(target).rstrip("/")
    dpkg = owners_under((root or "/",))  # every path dpkg names under the root: the standard library too
    areas = install_areas(now.python)
    # Packages whose installer is the system's (INSTALLER "debian", or a dist-info dpkg owns), now and then.
    system_files: dict[str, str] = {}
    for c in current:
        if c.summary.installer == "debian":
            for rel in (*c.files, *([c.dist_info] if c.dist_info else [])):
                system_files[rel] = c.summary.name
    system_names = {p.name for p in snapshot.packages if p.installer == "debian"}

    held: dict[str, list[str]] = {}
    outside: list[str] = []

    def owner(rel: str, package: str | None = None) -> str | None:
        who = dpkg.owner(f"{root}/{rel}")
        if who is None and rel in system_files:
            who = f"the system package of {system_files[rel]}"
        if who is None and package in system_names:
            who = f"the system package of {package}"
        return who

    def keep(rel: str, package: str | None = None) -> bool:
        who = owner(rel, package)
        if who is not None:
            held.setdefault(who, []).append(rel)
            return False
        if not rel.startswith(areas):  # the root of a system environment is "/": this is what bounds it
            outside.append(rel)
            return False
        return True

    writes = tuple(w for w in plan.writes if keep(w.path, w.package))
    removals = tuple(r for r in plan.removals if keep(r))
    remove_dirs = tuple(d for d in plan.remove_dirs if keep(d))
    modes = tuple(m for m in plan.modes if keep(m[0]))
    if not held and not outside:
        return plan
    dist_infos = tuple(d for d in plan.dist_infos if owner(d) is None and d.startswith(areas))
    warnings = list(plan.warnings)
    if outside:
        shown = ", ".join(sorted(outside)[:3]) + (", ..." if len(outside) > 3 else "")
        warnings.append(f"{len(outside)} path(s) lie outside the interpreter's install locations "
                        f"({', '.join(a.rstrip('/') or '/' for a in areas)}) and were left as they are ({shown})")
    for who, paths in sorted(held.items()):
        how = (f"apt-get install --reinstall {who}" if not who.startswith("the system package")
               else "reinstall it with the system package manager")
        shown = ", ".join(sorted(paths)[:3]) + (", ..." if len(paths) > 3 else "")
        warnings.append(f"{len(paths)} file(s) of {who} are managed by the system package manager and were "
                        f"left as they are ({shown}): restore them with `{how}`")
    return records.replace(plan, writes=writes, removals=removals, remove_dirs=remove_dirs, modes=modes,
                               dist_infos=dist_infos, warnings=tuple(warnings),
                               keeps=tuple(k for k in plan.keeps if owner(k[0]) is None and k[0].startswith(areas)))


def install_areas(python) -> tuple[str, ...]:
    """Where an in-place restore of a system environment may write (each ``rel/``, relative to its root):
    the site directories, the scripts folder, and the data prefix of each place pip installs to (purelib,
    platlib and the user site, less ``lib/pythonX.Y/...``: where ``data_files`` and headers go). Not the
    distribution's own ``dist-packages`` prefix (``/usr``): pip never installs there."""
    out = {*(python.sites or ()), python.scripts or "bin"}
    for lib in (python.purelib, python.platlib, python.user_site):
        if lib:
            out.add(lib)
            head, sep, _tail = f"/{lib.strip('/')}".partition("/lib/python")
            if not sep:
                head, sep, _tail = f"/{lib.strip('/')}".partition("/lib64/python")
            if sep and not head.strip("/"):
                return ("",)  # the root is the prefix (a pyenv build's): all of it is the installation's
            if sep:
                out.add(head)
    return tuple(sorted(f"{a.strip('/')}/" for a in out if a.strip("/")))


# -- restore --into of a system environment ------------------------------------------------------------------

_SHARE: list[bool] = [False]


def share_system_packages(on: bool) -> None:
    """``restore --into --system-site-packages``: leave the system-managed packages to the base interpreter
    (the new venv sees them through ``include-system-site-packages``) instead of copying them."""
    _SHARE[0] = bool(on)


def venv_view(snapshot: Snapshot, manifest_of=None) -> Snapshot:
    """The snapshot of a system environment as a venv built from it holds it (docs/format.md, "Environment
    kinds"): every site directory becomes the venv's ``lib/pythonX.Y/site-packages``, every scripts folder
    ``bin``; with ``share_system_packages`` the ``debian`` packages are left out and pyvenv.cfg says
    ``include-system-site-packages = true``. State ids name edited files by path: those of a package with
    edited files are computed again for the moved paths (``manifest_of``: the vault's ``load_manifest``).
    A venv's snapshot is returned as it is."""
    python = snapshot.python
    if not python.system:
        return snapshot
    site = f"lib/python{python.minor}/site-packages"
    scripts = {s for s in (python.scripts, (python.user_site or "").rsplit("/lib/", 1)[0] + "/bin") if s}
    share = _SHARE[0]

    def move(path: str, p_site: str | None) -> str:
        if p_site and path.startswith(p_site.rstrip("/") + "/"):
            return site + path[len(p_site.rstrip("/")):]
        head, _, name = path.rpartition("/")
        return f"bin/{name}" if head in scripts else path

    packages = []
    for p in snapshot.packages:
        if share and p.installer == "debian":
            continue
        state = p.state_id
        if p.modified and manifest_of is not None and p.record == "ok":
            from envvault.model.identity import state_id

            man = manifest_of(p.manifest)
            state = state_id(p.build_id, [(posixpath.normpath(f"{site}/{f.record}"), f.sha256)
                                          for f in man.files if f.state == "modified" and f.sha256])
        packages.append(records.replace(
            p, state_id=state,
            modified=tuple(move(x, p.site) for x in p.modified), missing=tuple(move(x, p.site) for x in p.missing),
            exec=None if p.exec is None else tuple(sorted(move(x, p.site) for x in p.exec))))
    cfg = {"include-system-site-packages": "true"} if share else {}
    moved = records.replace(python, purelib=site, platlib=site, scripts="bin", executable="bin/python",
                                pyvenv_cfg=cfg)
    return records.replace(snapshot, python=moved, packages=tuple(packages))


def refuse_uncopyable(snapshot: Snapshot, has) -> None:
    """``RefusedError`` (one line, before anything is made) when ``snapshot`` (a ``venv_view``) still holds
    system-managed packages whose files were not stored (no RECORD: Debian's egg-info packages), which a
    copy cannot hold: ``--system-site-packages`` leaves them to the base interpreter. ``has``: the vault's."""
    if not snapshot.python.system or snapshot.lock_only:
        return
    lost = [p for p in snapshot.packages
            if p.installer == "debian" and (p.record != "ok" or p.manifest is None or not has(p.manifest))]
    if lost:
        from envvault.errors import RefusedError

        names = ", ".join(f"{p.name} {p.version}" for p in lost[:8]) + (", ..." if len(lost) > 8 else "")
        raise RefusedError(f"cannot copy {len(lost)} system-managed package(s) into a venv: {names} had no RECORD, "
                           "so their files were not stored; pass --system-site-packages to leave them to the "
                           "base interpreter")


def venv_manifest(man, python):
    """A system environment's distribution manifest with its paths where a venv (``python``: the
    ``venv_view``'s) puts them: each file at site-packages + its RECORD path, as an installer does; a path
    that would leave the venv refuses the restore."""
    from envvault.errors import RefusedError
    from envvault.safepaths import path_problem

    site = python.purelib or "lib"
    files, bad = [], []
    for i, f in enumerate(man.files):
        new = posixpath.normpath(f"{site}/{f.record}")
        why = path_problem(new)
        if why is not None:
            bad.append(f"files[{i}].record {f.record!r} {why}")
            continue
        files.append(records.replace(f, path=new))
    if bad:
        raise RefusedError(f"refusing to restore {man.name} {man.version}: " + "; ".join(bad[:10]))
    dist_info = f"{site}/{posixpath.basename(man.dist_info)}" if man.dist_info else man.dist_info
    return records.replace(man, files=tuple(files), dist_info=dist_info)

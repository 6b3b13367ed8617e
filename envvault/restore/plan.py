"""Plan an in-place restore: which files to write, which to delete, which to leave alone. Pure: no I/O.

The plan is computed from the snapshot (a ``model.snapshot.Snapshot``), the snapshot's manifests (``DistManifest``
records read through a callable, so a plan never touches the environment) and the environment's current state
(its scan, and ``CurrentDist`` records built by ``envvault.restore.current.read_current``). ``--dry-run``
prints exactly this plan.
"""

from __future__ import annotations

import fnmatch
import posixpath
from envvault.model.records import dataclass, replace
from typing import Callable, Iterable, Sequence

from envvault.diff import DiffResult, diff_snapshots, exec_change
from envvault.errors import RefusedError
from envvault.journal import is_dist_info_name
from envvault.model.identity import is_bytecode
from envvault.model.manifest import DistManifest
from envvault.model.snapshot import PackageSummary, PythonInfo, Snapshot
from envvault.safepaths import link_target_problem, path_problem

__all__ = ["CurrentDist", "FileWrite", "Plan", "make_plan", "site_folders", "check_python", "check_rel_path", "is_pyc"]


@dataclass(frozen=True)
class CurrentDist:
    """One installed distribution as it is now. ``files`` maps every RECORD path (relative to the
    environment) to its sha256 (urlsafe b64) when the bytes on disk are known to match it, else None."""

    summary: PackageSummary  # the scan's
    dist_info: str | None  # relative to the environment; None when unknown
    files: dict[str, str | None]
    has_record: bool = True

    @property
    def name(self) -> str:
        return self.summary.name


@dataclass(frozen=True)
class FileWrite:
    """One file to put in place: its content is the concatenation of ``chunks`` (or a symlink to ``link``)."""

    path: str
    chunks: tuple[str, ...]
    size: int
    sha256: str | None
    mode: int
    link: str | None
    package: str


@dataclass(frozen=True)
class Plan:
    snapshot_id: str
    diff: DiffResult  # from the environment now to the snapshot
    writes: tuple[FileWrite, ...]
    keeps: tuple[tuple[str, int], ...]  # files of changed packages whose bytes already match (path, mode)
    removals: tuple[str, ...]  # files to delete
    remove_dirs: tuple[str, ...]  # dist-info folders of removed or replaced distributions
    install: tuple[str, ...]  # "name version" of packages written whole or in part
    remove: tuple[str, ...]  # "name version" of packages removed
    warnings: tuple[str, ...] = ()
    dist_infos: tuple[str, ...] = ()  # dist-info folders of the packages written
    modes: tuple[tuple[str, int], ...] = ()  # kept files whose execute bit differs from the snapshot's (path, mode)
    unlinked: tuple[str, ...] = ()  # symlinks out of the environment replaced by folders (``make_plan``)

    @property
    def empty(self) -> bool:
        return not (self.writes or self.removals or self.remove_dirs or self.modes)

    @property
    def bytes(self) -> int:
        return sum(w.size for w in self.writes)

    @property
    def changed(self) -> int:
        """Packages the restore touches: installed, reinstalled, repaired or removed."""
        return len(self.install) + len(self.remove)

    def staging_dirs(self) -> list[str]:
        return sorted({posixpath.dirname(w.path) for w in self.writes})

    def to_json(self) -> dict:
        return {
            "snapshot": self.snapshot_id,
            "diff": self.diff.to_json(),
            "install": list(self.install),
            "remove": list(self.remove),
            "write_files": len(self.writes),
            "write_bytes": self.bytes,
            "keep_files": len(self.keeps),
            "mode_files": len(self.modes),
            "remove_files": len(self.removals),
            "remove_dirs": list(self.remove_dirs),
            "warnings": list(self.warnings),
            "unlinked": list(self.unlinked),
        }


is_pyc = is_bytecode  # the one rule, in envvault.model.identity


check_rel_path = path_problem  # the one rule, in envvault.safepaths


def check_python(snapshot_python: PythonInfo, current_python: PythonInfo) -> None:
    """Refuse an in-place restore across interpreters whose installed files are not interchangeable."""
    snap, cur = snapshot_python, current_python
    problems = []
    if snap.implementation != cur.implementation:
        problems.append(f"implementation {snap.implementation} vs {cur.implementation}")
    if _minor(snap.version) != _minor(cur.version):
        problems.append(f"Python {snap.version} vs {cur.version}")
    elif snap.abi != cur.abi or (snap.soabi and cur.soabi and snap.soabi != cur.soabi):
        problems.append(f"ABI {snap.soabi or snap.abi} vs {cur.soabi or cur.abi}")
    if snap.platform != cur.platform:
        problems.append(f"platform {snap.platform} vs {cur.platform}")
    if problems:
        raise RefusedError(
            "refusing to restore in place: the snapshot was taken with " + "; ".join(problems) +
            " (snapshot vs this environment); use --into NEW_PATH to build a fresh environment"
        )


def _minor(v: str | None) -> str:
    return ".".join((v or "").split(".")[:2])


def _same(snap: PackageSummary, cur: PackageSummary) -> bool:
    return (
        snap.version == cur.version
        and snap.build_id == cur.build_id
        and snap.state_id == cur.state_id
        and set(snap.missing) == set(cur.missing)
        and not exec_change(snap, cur)
    )


def site_folders(*pythons: PythonInfo) -> set[str]:
    return {posixpath.normpath(d).strip("/") for py in pythons
            for d in (py.purelib, py.platlib, *(py.sites or ())) if isinstance(d, str) and d}


def _in_site_dir(rel: str, site_dirs: set[str]) -> bool:
    """Whether ``rel`` is a dist-info folder lying directly in one of ``site_dirs`` (relative to the environment;
    none known: a ``lib*/python*/site-packages`` folder, as a venv has)."""
    if not is_dist_info_name(rel):
        return False
    parent = posixpath.dirname(rel)
    if site_dirs:
        return parent in site_dirs
    return fnmatch.fnmatchcase(parent, "lib*/python*/site-packages")


def make_plan(
    snapshot_id: str,
    snapshot: Snapshot,
    now: Snapshot,
    current: Sequence[CurrentDist],
    manifest_of: Callable[[str], DistManifest],
    *,
    pending_removals: Iterable[str] = (),
    shared: Callable[[str, int], bool] | None = None,
    unlinked: Iterable[str] = (),
) -> Plan:
    """Decide the restore of ``snapshot`` onto the environment described by ``now`` (its scan) and
    ``current`` (the scan's distributions with their RECORDs).

    ``pending_removals``: files an interrupted restore had planned to delete (from its journal); they are
    deleted now unless the snapshot owns them. ``shared(path, mode)``: whether a file on disk is another's too
    (a hardlink into an installer's cache, uv's default; a symlink out) and has not ``mode``: one whose bytes
    match but whose execute bit may differ (its package's says so, or another package lists it) is then
    written anew, never chmod-ed (that would change the other file). ``unlinked``: folders of the snapshot
    that are symlinks leading out of the environment today (an installer's cache: pdm links a package's
    folders there), which the commit replaces with real folders (``apply.links_out``): every file of the
    snapshot under them is written, none kept (a distribution otherwise untouched is written whole), and
    nothing under them is deleted (what the link leads to is not the environment's). Raises ``RefusedError``
    listing every unsafe manifest path.
    """
    unlinked = tuple(sorted(set(unlinked)))
    under = tuple(u + "/" for u in unlinked)
    diff = diff_snapshots(now, snapshot, old_label="current", new_label=snapshot_id[:12], scope="environment")
    cur_by_name: dict[str, list[CurrentDist]] = {}
    for c in current:
        cur_by_name.setdefault(c.name, []).append(c)

    untouched: list[CurrentDist] = []
    to_install: list[tuple[PackageSummary, CurrentDist | None]] = []
    for p in snapshot.packages:
        cands = cur_by_name.get(p.name, [])
        twin = next((c for c in cands if _same(p, c.summary)), None)
        if twin is not None:
            cands.remove(twin)
            if under and any(path.startswith(under) for path in twin.files):
                to_install.append((p, twin))  # its files under a link the commit replaces: written whole
                continue
            untouched.append(twin)
            continue
        to_install.append((p, cands.pop(0) if cands else None))
    leaving = [c for cs in cur_by_name.values() for c in cs]  # current dists the snapshot does not keep

    warnings: list[str] = []
    problems: list[str] = []
    # What is known of the bytes on disk, from the distributions a restore may rewrite or remove: an untouched
    # one's files are read only when a removal could hit one of them (``read_current`` defers its RECORD).
    known: dict[str, str | None] = {}
    still = {id(c) for c in untouched}
    for c in current:
        if id(c) in still:
            continue
        for path, sha in c.files.items():
            known[path] = sha if known.get(path, sha) == sha else None

    writes: list[FileWrite] = []
    keeps: list[tuple[str, int]] = []
    modes: list[tuple[str, int]] = []
    owned: set[str] = set()
    taken: set[str] = set()  # paths already written or kept: a RECORD may list a file twice, two RECORDs one file
    written_at: dict[str, int] = {}  # a written path's place in ``writes``
    system_names = {q.name for q in snapshot.packages if q.installer == "debian"}
    absent: set[str] = set()
    install_names: list[str] = []
    dist_infos: list[str] = []
    site_dirs = site_folders(snapshot.python, now.python)
    replaced: list[CurrentDist] = []
    for p, cur in to_install:
        label = f"{p.name} {p.version}"
        chmod = set(exec_change(p, cur.summary)) if cur is not None else set()
        if cur is not None:
            replaced.append(cur)
        if p.record == "missing":
            warnings.append(f"{label} was installed without RECORD: its files are not in the vault, so it cannot be restored")
            if cur is not None:
                owned.update(cur.files)
                replaced.remove(cur)
            continue
        man = manifest_of(p.manifest)
        install_names.append(label)
        mdi = man.dist_info
        for i, f in enumerate(man.files):
            path = f.path
            why = check_rel_path(path)
            if why is not None:
                problems.append(f"{label}: files[{i}].path {path!r} {why}")
                continue
            if is_pyc(path):
                owned.add(path)
                continue
            if f.state == "missing":
                absent.add(path)
                continue
            if path in taken:  # written once (its bytes are the same: one file on disk, hashed once a listing)
                at = written_at.get(path)
                if at is not None and writes[at].package in system_names and p.installer != "debian":
                    # held only if every distribution listing it is the system's (managed.py)
                    writes[at] = replace(writes[at], package=p.name)
                continue
            if f.link is not None:
                lp = link_target_problem(path, f.link)
                if lp is not None:
                    problems.append(f"{label}: files[{i}].path {path!r} {lp}")
                    continue
                taken.add(path)
                written_at[path] = len(writes)
                writes.append(FileWrite(path, (), 0, None, 0o777, f.link, p.name))
                owned.add(path)
                continue
            chunks = f.chunks
            if chunks is None:
                warnings.append(f"{label}: {path} has no stored content (lock-only or damaged manifest)")
                continue
            mode = int(f.mode or 0o644) & 0o7777
            owned.add(path)
            taken.add(path)
            if known.get(path) is not None and known[path] == f.sha256 and not path.startswith(under or "\0") and not (
                    (path in chmod or cur is None) and shared is not None and shared(path, mode)):
                keeps.append((path, mode))
                if path in chmod:
                    modes.append((path, mode))
                continue
            written_at[path] = len(writes)
            writes.append(FileWrite(path, tuple(chunks), int(f.size or 0), f.sha256, mode, None, p.name))
        if isinstance(mdi, str) and check_rel_path(mdi) is None:
            owned.add(mdi)
            if _in_site_dir(mdi, site_dirs):  # journalled: a killed restore's half-made one is removed
                dist_infos.append(mdi)
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise RefusedError(f"refusing to restore {snapshot_id[:12]}: its manifests name paths outside the environment: {shown}")

    removals: set[str] = set()
    remove_names: list[str] = []
    for c in leaving:
        remove_names.append(f"{c.summary.name} {c.summary.version}")
        if not c.has_record:
            warnings.append(f"{c.summary.name} {c.summary.version} was installed without RECORD: its files are unknown, so they stay")
    for c in leaving + replaced:
        removals.update(c.files)
    # A file the snapshot recorded as deleted is deleted only where a distribution now installed (one the
    # restore rewrites or removes) lists it: a manifest is the vault's word, and a crafted one naming
    # ``pyvenv.cfg``, ``bin/python3`` or a user's file "missing" deleted it (helper 30, F3).
    removals.update(absent & known.keys())
    removals.update(p for p in pending_removals if check_rel_path(p) is None)
    removals -= owned
    doomed = {c.dist_info for c in leaving + replaced if c.dist_info and c.has_record} - owned
    if removals or doomed:  # never delete a file an untouched distribution lists
        untouched_files = {path for c in untouched for path in c.files}
        removals -= untouched_files
        doomed -= untouched_files
    if under:  # what lies under a link the commit replaces goes with the link, untouched where it leads
        removals = {r for r in removals if not r.startswith(under)}
        doomed = {d for d in doomed if not (d + "/").startswith(under)}
    remove_dirs = sorted(doomed)
    return Plan(
        snapshot_id=snapshot_id,
        diff=diff,
        writes=tuple(sorted(writes, key=lambda w: w.path)),
        keeps=tuple(sorted(keeps)),
        removals=tuple(sorted(removals)),
        remove_dirs=tuple(remove_dirs),
        install=tuple(install_names),
        remove=tuple(remove_names),
        warnings=tuple(warnings),
        dist_infos=tuple(sorted(dist_infos)),
        modes=tuple(sorted(modes)),
        unlinked=unlinked,
    )

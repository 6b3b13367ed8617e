"""Files a system package manager owns, held out of an in-place restore (docs/format.md, "Environment kinds").

In a system environment (an interpreter's own installation) some files belong to dpkg: rewriting or deleting
them would leave apt's database lying about the system. The plan of an in-place restore (``plan.make_plan``)
is therefore filtered here before anything is journalled or staged: every write, deletion, mode change and
dist-info removal of a managed file is dropped, and one warning per system package says what was left and
the command that restores it. pip- and uv-installed files stay in the plan, restored as in a venv. Pure but
for reading dpkg's file lists (``envvault.env.dpkg``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from envvault.model.snapshot import Snapshot
from envvault.restore.plan import CurrentDist, Plan

__all__ = ["hold_managed"]


def hold_managed(plan: Plan, target: Path, now: Snapshot, snapshot: Snapshot,
                 current: Sequence[CurrentDist]) -> Plan:
    """``plan`` without the changes to system-managed files; the plan itself for a venv."""
    if not (now.python.system or snapshot.python.system):
        return plan
    from envvault.env.dpkg import owners_under

    root = str(target).rstrip("/")
    folders = [f"{root}/{rel}" for rel in (*(now.python.sites or ()), now.python.scripts or "bin")]
    dpkg = owners_under(tuple(folders))
    # Packages whose installer is the system's (INSTALLER "debian", or a dist-info dpkg owns), now and then.
    system_files: dict[str, str] = {}
    for c in current:
        if c.summary.installer == "debian":
            for rel in (*c.files, *([c.dist_info] if c.dist_info else [])):
                system_files[rel] = c.summary.name
    system_names = {p.name for p in snapshot.packages if p.installer == "debian"}

    held: dict[str, list[str]] = {}

    def owner(rel: str, package: str | None = None) -> str | None:
        who = dpkg.owner(f"{root}/{rel}")
        if who is None and rel in system_files:
            who = f"the system package of {system_files[rel]}"
        if who is None and package in system_names:
            who = f"the system package of {package}"
        return who

    def keep(rel: str, package: str | None = None) -> bool:
        who = owner(rel, package)
        if who is None:
            return True
        held.setdefault(who, []).append(rel)
        return False

    writes = tuple(w for w in plan.writes if keep(w.path, w.package))
    removals = tuple(r for r in plan.removals if keep(r))
    remove_dirs = tuple(d for d in plan.remove_dirs if keep(d))
    modes = tuple(m for m in plan.modes if keep(m[0]))
    if not held:
        return plan
    dist_infos = tuple(d for d in plan.dist_infos if owner(d) is None)
    warnings = list(plan.warnings)
    for who, paths in sorted(held.items()):
        how = (f"apt-get install --reinstall {who}" if not who.startswith("the system package")
               else "reinstall it with the system package manager")
        shown = ", ".join(sorted(paths)[:3]) + (", ..." if len(paths) > 3 else "")
        warnings.append(f"{len(paths)} file(s) of {who} are managed by the system package manager and were "
                        f"left as they are ({shown}): restore them with `{how}`")
    return dataclasses.replace(plan, writes=writes, removals=removals, remove_dirs=remove_dirs, modes=modes,
                               dist_infos=dist_infos, warnings=tuple(warnings),
                               keeps=tuple(k for k in plan.keeps if owner(k[0]) is None))

"""The environment a stamping process runs in, at one moment: its dist-info signature, its lock-level state
(fingerprint and ``(name, version, build id)`` per package) and what changed since the process started.

The signature costs a directory listing and two stats per distribution; the state comes from the stamp index
or the vault's stat cache when the dist-info files are as a scan last saw them, else from a lock-only scan
(dist-info only, never hashing installed files). Top-level imports are the standard library and the model:
the stamping hook may create a session at interpreter start-up; the scanner is imported at the first stamp.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from envvault.model.records import dataclass
from pathlib import Path

from envvault.errors import EnvvaultError
from envvault.model.identity import lock_fingerprint
from envvault.model.stamp import Drift, DriftChange
from envvault.model.stamp_index import IndexedState
from envvault.torch import stamp_index

__all__ = ["Signature", "EnvState", "dist_signature", "python_version", "state_from_cache", "environment_state",
           "drift_between"]

# (dist-info directory relative to the prefix, RECORD stat key, METADATA stat key); stat keys as in the
# stat cache: [size, mtime_ns, inode, ctime_ns], or None for a missing file.
Signature = tuple[tuple[str, "list[int] | None", "list[int] | None"], ...]


@dataclass(frozen=True)
class EnvState:
    """The environment at one moment: its lock-level fingerprint and (name, version, build id) per package."""

    prefix: str
    python: str
    fingerprint: str
    packages: tuple[tuple[str, str, str], ...]
    signature: Signature


def _stat_key(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def dist_signature(prefix: Path, sites: list[Path]) -> Signature:
    """The dist-info directories of ``sites`` with the stats of their RECORD and METADATA: equal
    signatures mean no distribution was installed, removed or rewritten. Standard library only; costs a
    directory listing and two stats per distribution."""
    out = []
    seen = set()
    for site in sites:
        if site in seen:
            continue
        seen.add(site)
        try:
            entries = os.scandir(site)
        except OSError:
            continue
        with entries:
            for e in entries:
                if e.name.endswith((".dist-info", ".egg-info", ".egg-link")):
                    rel = os.path.relpath(e.path, prefix).replace(os.sep, "/")
                    out.append((rel, _stat_key(e.path + "/RECORD"), _stat_key(e.path + "/METADATA")))
    out.sort()
    return tuple(out)


def python_version() -> str:
    return "%d.%d.%d" % sys.version_info[:3]


def _state_key(prefix: Path, signature: Signature) -> str:
    return hashlib.sha256(json.dumps([str(prefix), python_version(), signature]).encode()).hexdigest()


def state_from_cache(vault, prefix: Path, signature: Signature) -> EnvState | None:
    """The state described by ``signature``, from the stamp index, else from the vault's stat cache for
    ``prefix`` when every distribution in it was scanned before with exactly these RECORD / METADATA stats;
    else None.

    Works after the environment on disk has moved on, which is how the fingerprint at process start is
    recovered when the first save comes after a change. Reads the caches only, never the environment.
    """
    known = stamp_index.load(vault).states.get(_state_key(prefix, signature))
    if known is not None:
        return EnvState(str(prefix), python_version(), known.fingerprint, known.packages, signature)
    from envvault.snap import statcache_for  # at the first stamp, not at start-up (module docstring)

    groups = statcache_for(vault, prefix).groups  # a full snap's cache: megabytes of JSON for a big venv
    packages = []
    for key, record, meta in signature:
        group = groups.get(key) or {}
        lock = group.get("lock") or {}
        if record is not None and lock.get("record_stat") == record and lock.get("meta_stat") == meta:
            summary = lock.get("summary") or {}
        elif record is not None and group.get("record_stat") == record and group.get("meta_stat") == meta:
            summary = group.get("summary") or {}  # a full or check scan: the same RECORD gives the same build id
        else:
            return None
        if not all(isinstance(summary.get(k), str) for k in ("name", "version", "build_id")):
            return None
        packages.append((summary["name"], summary["version"], summary["build_id"]))
    return _remembered(vault, prefix, packages, signature)


def _remembered(vault, prefix: Path, packages: list[tuple[str, str, str]], signature: Signature) -> EnvState:
    """The state of these packages, remembered in the stamp index so the next process skips the stat cache."""
    packages.sort()
    fp = lock_fingerprint(python_version(), packages)
    stamp_index.remember_state(vault, _state_key(prefix, signature), IndexedState(fp, tuple(packages)))
    return EnvState(str(prefix), python_version(), fp, tuple(packages), signature)


def environment_state(vault, prefix: Path, sites: list[Path]) -> EnvState:
    """The environment at ``prefix`` now. Served from the caches when the dist-info files are as the last
    scan saw them; otherwise a lock-only scan (dist-info only), whose findings warm the stat cache."""
    from envvault.snap import scan_environment  # at the first stamp, not at start-up (module docstring)

    for _ in range(3):
        before = dist_signature(prefix, sites)
        cached = state_from_cache(vault, prefix, before)
        if cached is not None:
            return cached
        _interp, packages, _warnings, cache, _ing, _stats = scan_environment(vault, prefix, mode="lock")
        cache.save()
        after = dist_signature(prefix, sites)
        if after == before:  # nothing was installed while the scan ran
            return _remembered(vault, prefix, [(p["name"], p["version"], p["build_id"]) for p in packages], after)
    raise EnvvaultError(f"{prefix} kept changing while envvault read it (an install in progress?)")


def drift_between(start: EnvState | None, start_signature: Signature, now: EnvState | None,
                  now_signature: Signature) -> Drift | None:
    """What changed on disk since the process started, or None. Distributions are named from the states
    when both are known, else from the dist-info directory names."""
    if start is not None and now is not None:
        if start.fingerprint == now.fingerprint:
            return None
        old = {n: (v, b) for n, v, b in start.packages}
        new = {n: (v, b) for n, v, b in now.packages}
        changed = []
        for name in sorted(old.keys() | new.keys()):
            o, n = old.get(name), new.get(name)
            if o != n:
                changed.append(DriftChange(name, o[0] if o else None, n[0] if n else None,
                                           bool(o and n and o[0] == n[0])))
        return Drift(now.fingerprint, tuple(changed))
    if start_signature == now_signature:
        return None
    old_dirs = {d: (r, m) for d, r, m in start_signature}
    new_dirs = {d: (r, m) for d, r, m in now_signature}
    changed = []
    for d in sorted(old_dirs.keys() | new_dirs.keys()):
        if old_dirs.get(d) != new_dirs.get(d):
            name, _, version = Path(d).name.rsplit(".", 1)[0].partition("-")
            changed.append(DriftChange(name, version if d in old_dirs else None, version if d in new_dirs else None,
                                       d in old_dirs and d in new_dirs))
    return Drift(now.fingerprint if now else None, tuple(changed))

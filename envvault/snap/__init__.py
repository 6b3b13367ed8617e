"""Taking a snapshot of an environment: ``take.py`` (the snap: scan, cache hook, objects, then the snapshot
document, the commit point), ``scan.py`` (the environment read through its reader, fast path from the stat
cache), ``manifests.py`` (one distribution's manifest and summary)."""

from __future__ import annotations

from .scan import scan_current, scan_environment, statcache_for
from .take import SnapResult, take_snapshot

__all__ = ["take_snapshot", "SnapResult", "scan_environment", "scan_current", "statcache_for"]

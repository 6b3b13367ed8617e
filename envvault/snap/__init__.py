"""Taking a snapshot of an environment: ``take.py`` (the snap: scan, cache hook, objects, then the snapshot
document, the commit point), ``scan.py`` (the environment read through its reader, fast path from the stat
cache), ``manifests.py`` (one distribution's manifest and summary)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["take_snapshot", "SnapResult", "scan_environment", "scan_current", "statcache_for"]


def __getattr__(name: str) -> Any:
    """Each name from its module when first asked (``status`` scans and never takes a snapshot: it does not
    import ``take.py`` and the transaction behind it)."""
    if name in ("scan_current", "scan_environment", "statcache_for"):
        from . import scan

        return getattr(scan, name)
    if name in ("take_snapshot", "SnapResult"):
        from . import take

        return getattr(take, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

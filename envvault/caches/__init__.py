"""Compile caches: where they are, what they hold, and which environment they belong to.

Names are imported on first use (PEP 562): an unchanged cache must cost a snap a few milliseconds, and
the fingerprint machinery alone takes longer than that to import.
"""

from __future__ import annotations

import importlib
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "CacheLocation",
    "discover_caches",
    "CacheFile",
    "walk_cache",
    "stable_read",
    "Fingerprint",
    "GpuInfo",
    "Mismatch",
    "fingerprint_venv",
    "fingerprint_from_tree",
    "compare",
]

_HOME = {
    "CacheLocation": "discover",
    "discover_caches": "discover",
    "CacheFile": "walk",
    "walk_cache": "walk",
    "stable_read": "walk",
    "Fingerprint": "fingerprint",
    "GpuInfo": "fingerprint",
    "Mismatch": "fingerprint",
    "fingerprint_venv": "fingerprint",
    "fingerprint_from_tree": "_tree",
    "compare": "fingerprint",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)

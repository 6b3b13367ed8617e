"""Compile caches: where they are, what they hold, and which environment they belong to."""

from .discover import CacheLocation, discover_caches
from .fingerprint import Fingerprint, GpuInfo, Mismatch, compare, fingerprint_from_tree, fingerprint_venv
from .walk import CacheFile, stable_read, walk_cache

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

"""envvault: exact, restorable snapshots of Python environments and their compile caches."""

__all__ = ["__version__"]
__version__ = "0.1.0"

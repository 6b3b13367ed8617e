"""Checkpoint support: readers and stamp writers for torch / safetensors files that need no torch.

Nothing in this package imports torch at module import time; the readers use only the standard library
and never execute code named by a checkpoint. Import the submodules directly:
``envvault.torch.checkpoint`` (read), ``envvault.torch.stamp_io`` (write), ``envvault.torch.pickle_reader``.

The stamping API is re-exported here (loaded on first use): ``envvault.torch.enable()``,
``envvault.torch.stamp(obj)``, ``envvault.torch.disable()``, ``envvault.torch.current_stamp()``; see
:mod:`envvault.torch.plugin`.
"""

__all__ = ["enable", "disable", "stamp", "current_stamp"]


def __getattr__(name: str):
    if name in __all__:
        from envvault.torch import plugin

        return getattr(plugin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

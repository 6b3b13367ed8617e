"""Checkpoint support: readers and stamp writers for torch / safetensors files that need no torch.

Nothing in this package imports torch at module import time; the readers use only the standard library
and never execute code named by a checkpoint. Import the submodules directly:
``envvault.torch.checkpoint`` (read), ``envvault.torch.stamp_io`` (write), ``envvault.torch.pickle_reader``.
"""

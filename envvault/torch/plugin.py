"""Stamping checkpoints as a training process writes them: ``stamp``, ``enable``, ``disable``, ``current_stamp``.

``enable()`` wraps ``torch.save`` for the process, and ``safetensors.torch.save_file`` / ``save`` and
``torch.distributed.checkpoint.save`` as soon as those are imported. Where the stamp goes
(``../shared/docs/facts.md`` §5):

- a dict checkpoint: a copy of the dict with the key ``"envvault"`` (plain types, so
  ``torch.load(weights_only=True)`` still loads it); the caller's dict is not changed;
- a bare state_dict (a module's ``state_dict()``, or any dict with a tensor at its top level) or any
  other object: the record ``<prefix>/extra/envvault.json`` inside the zip, written by torch's own zip
  writer as part of the same save (to a path or a file object), so nothing is copied afterwards (where a
  torch lacks that writer hook, a path gets the record after the save, through a temp file and rename,
  and a file object goes unstamped with a warning); with the legacy format
  (``_use_new_zipfile_serialization=False``) such objects are left unstamped, with a warning;
- safetensors: ``__metadata__["envvault"]`` (JSON text; ``"format": "pt"`` is kept or added);
- a distributed checkpoint directory: an ``envvault.json`` sidecar, written by rank 0.

Stamping never raises into the training loop: a failure is logged once to the ``envvault`` logger and the
checkpoint is saved as if stamping were off; when only the vault fails, the stamp still carries the
fingerprint. Nothing here imports torch at import time. What the process knows (its environment at start,
the snapshot naming it, the drift since) is the :class:`envvault.torch.session.Session`; the work behind the
first stamp of a process happens at that first stamp.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from envvault.torch.afterimport import AfterImport
from envvault.model.stamp import STAMP_KEY, STAMP_RECORD
from envvault.torch.session import Session
from envvault.torch.session import forget_warnings as _forget_warnings
from envvault.torch.session import warn as _warn

__all__ = ["stamp", "enable", "disable", "current_stamp", "after_import"]

_GLOBAL = threading.Lock()
_session: Session | None = None
_patched: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, wrapper)
_tls = threading.local()  # .record: the zip record the running torch.save should write
_AFTER = AfterImport(_warn)


def after_import(name: str, callback: Callable[[Any], None]) -> None:
    """Run ``callback(module)`` once module ``name`` has been imported: now if it already is."""
    _AFTER.add(name, callback)


def _get_session() -> Session:
    global _session
    with _GLOBAL:
        if _session is None:
            _session = Session(None, _full_snapshot_default())
        return _session


def _full_snapshot_default() -> bool:
    return os.environ.get("ENVVAULT_STAMP_FULL_SNAPSHOT", "1") != "0"


def _current() -> dict | None:
    try:
        return _get_session().stamp()
    except Exception as err:  # noqa: BLE001 - a bug here must not stop a training run
        _warn(f"checkpoint not stamped: {type(err).__name__}: {err}")
        return None


# --- public API ------------------------------------------------------------------------------------------


def current_stamp() -> dict | None:
    """The stamp a checkpoint saved now would carry (plain JSON types), or None when stamping failed (the
    reason is logged). For writers this module does not wrap: put it where your format keeps metadata."""
    return _current()


def stamp(obj: Any) -> Any:
    """Stamp one checkpoint, explicitly.

    - a dict checkpoint: returns a copy with the ``"envvault"`` key (the argument is not changed);
    - a path (str or os.PathLike) to a saved checkpoint: stamps it in place (torch zip: the zip record,
      rewritten through a temp file; safetensors: ``__metadata__``; a directory: ``envvault.json``) and
      returns the path.

    A bare state_dict or another object cannot carry a key: save it, then stamp the path (``TypeError``
    says so). Failures to stamp are logged, never raised: the argument comes back unstamped.
    """
    if isinstance(obj, (str, os.PathLike)):
        _stamp_path(Path(obj))
        return obj
    if isinstance(obj, dict) and _kind(obj) == "dict":
        data = _current()
        stamped = _with_key(obj, data) if data is not None else None
        return obj if stamped is None else stamped
    what = "a bare state_dict" if isinstance(obj, dict) else f"a {type(obj).__name__}"
    raise TypeError(f"envvault.torch.stamp: {what} cannot carry a stamp key; torch.save it and pass the path, "
                    "or call envvault.torch.enable() to stamp every save")


def enable(*, vault: str | os.PathLike | None = None, full_snapshot: bool | None = None) -> None:
    """Stamp every checkpoint this process saves from now on (idempotent).

    ``vault``: the vault (default ``$ENVVAULT_HOME``, else ``~/.local/share/envvault``). ``full_snapshot``:
    when the environment is not in the vault yet, also vault its files in a detached ``envvault snap``
    (default: yes, unless ``ENVVAULT_STAMP_FULL_SNAPSHOT=0``); the stamp names the lock-only snapshot taken
    at once either way. Imports torch if the process has not.
    """
    global _session
    import torch

    with _GLOBAL:
        wanted = (str(vault) if vault is not None else None,
                  _full_snapshot_default() if full_snapshot is None else bool(full_snapshot))
        if _session is None or (_session.vault_path, _session.full_snapshot) != wanted:
            _session = Session(*wanted)
    _patch_torch(torch)
    after_import("safetensors.torch", _patch_safetensors)
    after_import("torch.distributed.checkpoint", _patch_dcp)


def disable() -> None:
    """Undo ``enable()``: the original save functions come back and what the process learnt is forgotten."""
    global _session
    with _GLOBAL:
        while _patched:
            owner, attr, original, wrapper = _patched.pop()
            if getattr(owner, attr, None) is wrapper:
                setattr(owner, attr, original)
        _AFTER.clear()
        _session = None
        _forget_warnings()


# --- where stamps go ---------------------------------------------------------------------------------------


def _kind(obj: Any) -> str:
    """"dict" (a checkpoint dict that can take a key), "state_dict" (one that must not), or "other".

    A dict is taken for a state_dict when it comes from ``nn.Module.state_dict()`` or holds any tensor at
    its top level: a state_dict may carry non-tensor extra state, and a strict ``load_state_dict`` refuses
    any key it does not know. Erring this way costs little: such dicts get the zip record instead (and, in
    the legacy format, no stamp).
    """
    if not isinstance(obj, dict):
        return "other"
    if hasattr(obj, "_metadata"):
        return "state_dict"
    torch = sys.modules.get("torch")
    if torch is not None and any(isinstance(v, torch.Tensor) for v in obj.values()):
        return "state_dict"
    return "dict"


def _with_key(obj: dict, data: dict) -> dict | None:
    try:
        out = dict(obj) if type(obj) is dict else copy.copy(obj)
    except Exception:  # noqa: BLE001 - an odd dict subclass: fall back to the zip record
        return None
    if type(out) is not type(obj):
        return None
    out[STAMP_KEY] = data
    return out


def _record_bytes(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _stamp_path(p: Path) -> None:
    from envvault.torch import stamp_io

    data = _current()
    if data is None:
        return
    try:
        if p.is_dir():
            stamp_io.write_sidecar(p, data)
            return
        with open(p, "rb") as f:
            head = f.read(4)
        if head == b"PK\x03\x04":
            stamp_io.add_zip_record(p, data=_record_bytes(data))
        else:
            stamp_io.set_safetensors_metadata(p, STAMP_KEY, _record_bytes(data).decode())
    except Exception as err:  # noqa: BLE001
        _warn(f"{p} not stamped: {err}")


def _patch(owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    original = getattr(owner, attr, None)
    if original is None or getattr(original, "__envvault_original__", None) is not None:
        return  # absent, or ours already
    import functools

    wrapper = functools.wraps(original)(make(original))
    wrapper.__envvault_original__ = original
    setattr(owner, attr, wrapper)
    _patched.append((owner, attr, original, wrapper))


def _patch_torch(torch: Any) -> None:
    import torch.serialization as ts

    with _GLOBAL:
        _patch(ts, "save", _wrap_torch_save)
        if torch.save is not ts.save and getattr(torch.save, "__envvault_original__", None) is None:
            torch.save = ts.save
            _patched.append((torch, "save", ts.save.__envvault_original__, ts.save))
        _patch(ts, "_open_zipfile_writer", _wrap_open_zipfile_writer)


def _wrap_torch_save(original: Callable) -> Callable:
    def save(obj, f, *args, **kwargs):
        plan = _plan_torch_save(obj, args, kwargs)
        if plan is None:
            return original(obj, f, *args, **kwargs)
        obj, record = plan
        if record is not None:
            _tls.record = record
        try:
            result = original(obj, f, *args, **kwargs)
        finally:
            leftover = _tls.__dict__.pop("record", None)
        if leftover is not None:  # torch's zip writer did not take it (another torch version)
            _record_after_save(f, leftover)
        return result

    return save


def _plan_torch_save(obj: Any, args: tuple, kwargs: dict) -> tuple[Any, bytes | None] | None:
    """(object to save, zip record or None), or None to save unstamped. Never raises."""
    try:
        new_zip = kwargs.get("_use_new_zipfile_serialization", args[2] if len(args) > 2 else True)
        kind = _kind(obj)
        if kind != "dict" and not new_zip:
            _warn("a non-dict checkpoint in the legacy format (_use_new_zipfile_serialization=False) cannot carry "
                  "a stamp; saved unstamped")
            return None
        data = _current()
        if data is None:
            return None
        if kind == "dict":
            stamped = _with_key(obj, data)
            if stamped is not None:
                return stamped, None
            if not new_zip:
                return None
        return obj, _record_bytes(data)
    except Exception as err:  # noqa: BLE001
        _warn(f"checkpoint not stamped: {type(err).__name__}: {err}")
        return None


class _WithRecord:
    """torch's zip-writer context, plus one record written just before the archive is closed."""

    def __init__(self, opener: Any, data: bytes) -> None:
        self.opener = opener
        self.data = data

    def __enter__(self):
        self.writer = self.opener.__enter__()
        return self.writer

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                self.writer.write_record(STAMP_RECORD, self.data, len(self.data))
            except Exception as err:  # noqa: BLE001
                _warn(f"checkpoint not stamped: torch's zip writer refused the record: {err}")
        return self.opener.__exit__(exc_type, exc, tb)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.opener, name)


def _wrap_open_zipfile_writer(original: Callable) -> Callable:
    def _open_zipfile_writer(name_or_buffer):
        opener = original(name_or_buffer)
        data = _tls.__dict__.pop("record", None)  # taken by the outermost save only
        return opener if data is None else _WithRecord(opener, data)

    return _open_zipfile_writer


def _record_after_save(f: Any, data: bytes) -> None:
    if not isinstance(f, (str, os.PathLike)):
        _warn("a non-dict checkpoint saved to a file object was not stamped (this torch's zip writer could not "
              "take the record)")
        return
    from envvault.torch.stamp_io import add_zip_record

    try:
        add_zip_record(f, data=data)
    except Exception as err:  # noqa: BLE001
        _warn(f"{f} not stamped: {err}")


def _patch_safetensors(module: Any) -> None:
    def wrap_save_file(original):
        def save_file(tensors, filename, metadata=None, *args, **kwargs):
            return original(tensors, filename, _with_metadata(metadata), *args, **kwargs)
        return save_file

    def wrap_save(original):
        def save(tensors, metadata=None, *args, **kwargs):
            return original(tensors, _with_metadata(metadata), *args, **kwargs)
        return save

    with _GLOBAL:
        _patch(module, "save_file", wrap_save_file)
        _patch(module, "save", wrap_save)


def _with_metadata(metadata: Any) -> Any:
    if metadata is not None and not isinstance(metadata, dict):
        return metadata  # let safetensors report it
    data = _current()
    if data is None:
        return metadata
    out = dict(metadata or {})
    out.setdefault("format", "pt")
    out[STAMP_KEY] = _record_bytes(data).decode()
    return out


def _patch_dcp(module: Any) -> None:
    def wrap(original):
        def save(state_dict, *args, **kwargs):
            result = original(state_dict, *args, **kwargs)
            _sidecar(kwargs.get("checkpoint_id"), kwargs.get("storage_writer"))
            return result
        return save

    with _GLOBAL:
        _patch(module, "save", wrap)


def _sidecar(checkpoint_id: Any, writer: Any) -> None:
    try:
        where = checkpoint_id if checkpoint_id is not None else getattr(writer, "path", None)
        if not isinstance(where, (str, os.PathLike)) or not Path(where).is_dir():
            return
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return
        data = _current()
        if data is not None:
            from envvault.torch.stamp_io import write_sidecar

            write_sidecar(where, data)
    except Exception as err:  # noqa: BLE001
        _warn(f"distributed checkpoint {checkpoint_id} not stamped: {err}")


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork time stays locked forever in the child: make new ones.
    global _GLOBAL
    _GLOBAL = threading.Lock()
    if _session is not None:
        _session.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

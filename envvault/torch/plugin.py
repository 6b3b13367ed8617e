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
fingerprint. Nothing here imports torch at import time; the work behind the first stamp of a process
(reading the environment, finding or taking its snapshot) happens at that first stamp.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["stamp", "enable", "disable", "current_stamp", "after_import"]

log = logging.getLogger("envvault")

STAMP_KEY = "envvault"  # the same names envvault.torch.checkpoint reads
STAMP_RECORD = "extra/envvault.json"
SNAPSHOT_RETRY_S = 300.0  # a vault that failed is tried again after this long, not at every save

_GLOBAL = threading.Lock()
_session: _Session | None = None
_patched: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, wrapper)
_warned: set[str] = set()
_tls = threading.local()  # .record: the zip record the running torch.save should write


def _warn(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("envvault: %s", message)


# --- the process's view of its environment ---------------------------------------------------------------


class _Session:
    """What stamping knows in this process. Created by ``enable()`` or the first stamp: the dist-info
    signature taken then is "the environment the process started with"."""

    def __init__(self, vault_path: str | None, full_snapshot: bool) -> None:
        import sysconfig

        from envvault.torch.stamp_doc import dist_signature

        self.vault_path = vault_path
        self.full_snapshot = full_snapshot
        self.prefix = Path(sys.prefix)
        paths = sysconfig.get_paths()
        self.sites = [Path(paths["purelib"]), Path(paths["platlib"])]
        self.start_signature = dist_signature(self.prefix, self.sites)
        self.lock = threading.Lock()
        self.base: dict | None = None
        self.start = None  # EnvState at start, when known
        self.vault = None  # the vault, when it opened
        self.scan_vault = None  # where the stat cache lives: the vault, else a temporary one
        self.retry_at = 0.0
        self.drift_signature = self.start_signature
        self.drift: dict | None = None

    def stamp(self) -> dict:
        with self.lock:
            if self.base is None:
                self._prepare()
            elif self.base["snapshot"] is None and self.start is not None and time.monotonic() >= self.retry_at:
                self._snapshot()
            drift = self._drift()
            doc = dict(self.base, drift=drift)
        doc["time"] = _now()
        doc["cwd"] = os.getcwd()
        return json.loads(json.dumps(doc))  # a private copy, plain JSON types only

    def _prepare(self) -> None:
        from envvault.torch import stamp_doc as sd

        self.warnings: list[str] = []
        self._open_vault()
        now = None
        try:
            signature = sd.dist_signature(self.prefix, self.sites)
            if signature != self.start_signature:  # installs since start: recover the start from the cache
                self.start = sd.state_from_cache(self.scan_vault, self.prefix, self.start_signature)
            now = sd.environment_state(self.scan_vault, self.prefix, self.sites)
            if now.signature == self.start_signature:
                self.start = now
            elif self.start is None:
                self.warnings.append("the environment changed after the process started and before its first "
                                     "stamp; its fingerprint at start is unknown")
        except Exception as err:  # noqa: BLE001 - reported in the stamp and the log, never raised
            self.warnings.append(f"cannot read the environment {self.prefix}: {err}")
        self.drift_signature = now.signature if now else self.start_signature
        self.drift = sd.drift_between(self.start, self.start_signature, now, self.drift_signature)
        root = str(self.vault.root) if self.vault else None
        self.base = sd.base_stamp(state=self.start, snapshot=None, vault_root=root, prefix=self.prefix,
                                  warnings=self.warnings)
        self._snapshot()
        for w in self.base["warnings"]:
            _warn(w)

    def _open_vault(self) -> None:
        from envvault.vault.store import Vault

        try:
            self.vault = Vault.open(self.vault_path, create=True)
            self.scan_vault = self.vault
        except Exception as err:  # noqa: BLE001
            self.warnings.append(f"the vault cannot be used ({err}); stamps carry the fingerprint but no snapshot")
            self.scan_vault = _temporary_vault()

    def _snapshot(self) -> None:
        """Name the start state's snapshot: an existing one, else one taken now, but only while the disk
        still holds that state (after a change it can only be found)."""
        from envvault.torch import stamp_doc as sd

        if self.vault is None or self.start is None:
            return
        found, problem = None, None
        try:
            if sd.dist_signature(self.prefix, self.sites) == self.start.signature:
                from envvault.torch.hook import runtime_path

                found = sd.ensure_snapshot(self.vault, self.prefix, self.start, full_snapshot=self.full_snapshot,
                                           runtime_path=runtime_path())
            else:
                found = sd.find_snapshot(self.vault, self.start.fingerprint)
                problem = None if found else (f"{self.vault.root} holds no snapshot of the environment this process "
                                              "started with, and it has changed on disk since")
        except Exception as err:  # noqa: BLE001
            problem = str(err)
        warnings = [w for w in self.base["warnings"] if not w.startswith("no snapshot for")]
        if found:
            self.base["snapshot"], self.base["snapshot_lock_only"] = found
        else:
            self.retry_at = time.monotonic() + SNAPSHOT_RETRY_S
            warnings.append(f"no snapshot for checkpoint stamps: {problem}")
            _warn(warnings[-1])
        self.base["warnings"] = warnings

    def _drift(self) -> dict | None:
        from envvault.torch import stamp_doc as sd

        signature = sd.dist_signature(self.prefix, self.sites)
        if signature == self.drift_signature:
            return self.drift
        try:
            now = sd.environment_state(self.scan_vault, self.prefix, self.sites)
        except Exception as err:  # noqa: BLE001
            _warn(f"cannot read the environment {self.prefix} for drift: {err}")
            now = None
        self.drift_signature = now.signature if now else signature
        self.drift = sd.drift_between(self.start, self.start_signature, now, self.drift_signature)
        if self.drift:
            names = ", ".join(c["name"] for c in self.drift["changed"]) or "unknown"
            _warn(f"the environment on disk changed since this process started ({names}); stamps say so")
        return self.drift


def _temporary_vault():
    import atexit
    import shutil
    import tempfile

    from envvault.vault.store import Vault

    path = tempfile.mkdtemp(prefix="envvault-stamp-")
    atexit.register(shutil.rmtree, path, True)
    return Vault.open(path, create=True)


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def _get_session() -> _Session:
    global _session
    with _GLOBAL:
        if _session is None:
            _session = _Session(None, _full_snapshot_default())
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
            _session = _Session(*wanted)
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
        _AFTER.callbacks.clear()
        if _AFTER in sys.meta_path:
            sys.meta_path.remove(_AFTER)
        _session = None
        _warned.clear()


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


# --- running code once a module is imported ----------------------------------------------------------------


class _AfterImport:
    """A meta path finder that lets the real finders find a module, then runs callbacks once the module
    has executed. Finds nothing itself; stays out of the way of every other import."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[[Any], None]]] = {}
        self.busy: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.callbacks or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = next((s for s in (self._ask(f, name, path, target) for f in sys.meta_path if f is not self)
                         if s is not None), None)
        finally:
            self.busy.discard(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_fire(module):
            exec_module(module)
            self.fire(name, module)

        try:
            loader.exec_module = exec_then_fire  # this loader object serves this one module only
        except (AttributeError, TypeError):
            pass
        return spec

    @staticmethod
    def _ask(finder, name, path, target):
        find = getattr(finder, "find_spec", None)
        return find(name, path, target) if find is not None else None

    def fire(self, name: str, module: Any) -> None:
        for callback in self.callbacks.pop(name, ()):
            try:
                callback(module)
            except Exception as err:  # noqa: BLE001 - an import must never fail because of stamping
                _warn(f"stamping not enabled for {name}: {type(err).__name__}: {err}")
        if not self.callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)


_AFTER = _AfterImport()


def after_import(name: str, callback: Callable[[Any], None]) -> None:
    """Run ``callback(module)`` once module ``name`` has been imported: now if it already is."""
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        try:
            callback(module)
        except Exception as err:  # noqa: BLE001
            _warn(f"stamping not enabled for {name}: {type(err).__name__}: {err}")
        return
    _AFTER.callbacks.setdefault(name, []).append(callback)
    if _AFTER not in sys.meta_path:
        sys.meta_path.insert(0, _AFTER)


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork time stays locked forever in the child: make new ones.
    global _GLOBAL
    _GLOBAL = threading.Lock()
    if _session is not None:
        _session.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

"""What stamping knows in one process: the environment it started with, the snapshot that names it, the
vault, and the drift since; :meth:`Session.stamp` is the stamp one save writes.

Created by ``enable()`` or the first stamp: the dist-info signature taken then is "the environment the process
started with". The work behind the first stamp (reading the environment, finding or taking its snapshot)
happens at that first stamp. Nothing here raises into a training loop except through ``stamp()``, whose
caller (:mod:`envvault.torch.plugin`) logs and saves unstamped.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

from envvault.model.stamp import Drift, Stamp
from envvault.torch import environment as envstate
from envvault.torch import naming, stamp_doc
from envvault.torch.hook import runtime_path

__all__ = ["Session", "warn", "forget_warnings", "SNAPSHOT_RETRY_S"]

log = logging.getLogger("envvault")

SNAPSHOT_RETRY_S = 300.0  # a vault that failed is tried again after this long, not at every save
_NO_SNAPSHOT = "no snapshot for checkpoint stamps"
_warned: set[str] = set()


def warn(message: str) -> None:
    """Log ``message`` to the ``envvault`` logger, once per process."""
    if message not in _warned:
        _warned.add(message)
        log.warning("envvault: %s", message)


def forget_warnings() -> None:
    _warned.clear()


class Session:
    """The process's view of its environment, for stamps."""

    def __init__(self, vault_path: str | None, full_snapshot: bool) -> None:
        import sysconfig

        self.vault_path = vault_path
        self.full_snapshot = full_snapshot
        self.prefix = Path(sys.prefix)
        paths = sysconfig.get_paths()
        self.sites = [Path(paths["purelib"]), Path(paths["platlib"])]
        self.start_signature = envstate.dist_signature(self.prefix, self.sites)
        self.lock = threading.Lock()
        self.base: Stamp | None = None
        self.start: envstate.EnvState | None = None  # at start, when known
        self.vault = None  # the vault, when it opened
        self.scan_vault = None  # where the stat cache lives: the vault, else a temporary one
        self.retry_at = 0.0
        self.drift_signature = self.start_signature
        self.drift: Drift | None = None

    def stamp(self) -> dict:
        """The stamp a save now writes (plain JSON types, a fresh dict)."""
        with self.lock:
            if self.base is None:
                self._prepare()
            elif self.base.snapshot is None and self.start is not None and time.monotonic() >= self.retry_at:
                self._snapshot()
            drift = self._drift()
            base = self.base
        return stamp_doc.for_save(base, drift)

    def _prepare(self) -> None:
        warnings: list[str] = []
        self._open_vault(warnings)
        now = None
        try:
            signature = envstate.dist_signature(self.prefix, self.sites)
            if signature != self.start_signature:  # installs since start: recover the start from the cache
                self.start = envstate.state_from_cache(self.scan_vault, self.prefix, self.start_signature)
            now = envstate.environment_state(self.scan_vault, self.prefix, self.sites)
            if now.signature == self.start_signature:
                self.start = now
            elif self.start is None:
                warnings.append("the environment changed after the process started and before its first "
                                "stamp; its fingerprint at start is unknown")
        except Exception as err:  # noqa: BLE001 - reported in the stamp and the log, never raised
            warnings.append(f"cannot read the environment {self.prefix}: {err}")
        self.drift_signature = now.signature if now else self.start_signature
        self.drift = envstate.drift_between(self.start, self.start_signature, now, self.drift_signature)
        root = self.vault.location if self.vault else None
        self.base = stamp_doc.base_stamp(state=self.start, snapshot=None, vault_root=root, prefix=self.prefix,
                                         warnings=warnings)
        self._snapshot()
        for w in self.base.warnings:
            warn(w)

    def _open_vault(self, warnings: list[str]) -> None:
        from envvault.vault.store import Vault

        try:
            self.vault = Vault.open(self.vault_path, create=True)
            self.scan_vault = self.vault
        except Exception as err:  # noqa: BLE001
            warnings.append(f"the vault cannot be used ({err}); stamps carry the fingerprint but no snapshot")
            self.scan_vault = _temporary_vault()

    def _snapshot(self) -> None:
        """Name the start state's snapshot: an existing one, else one taken now, but only while the disk
        still holds that state (after a change it can only be found)."""
        if self.vault is None or self.start is None:
            return
        found, problem = None, None
        try:
            if envstate.dist_signature(self.prefix, self.sites) == self.start.signature:
                found = naming.ensure_snapshot(self.vault, self.prefix, self.start, full_snapshot=self.full_snapshot,
                                               runtime_path=runtime_path())
            else:
                found = naming.find_snapshot(self.vault, self.start.fingerprint)
                problem = None if found else (f"{self.vault.location} holds no snapshot of the environment this process "
                                              "started with, and it has changed on disk since")
        except Exception as err:  # noqa: BLE001
            problem = str(err)
        warnings = [w for w in self.base.warnings if not w.startswith(_NO_SNAPSHOT)]
        if not found:
            self.retry_at = time.monotonic() + SNAPSHOT_RETRY_S
            warnings.append(f"{_NO_SNAPSHOT}: {problem}")
            warn(warnings[-1])
        self.base = stamp_doc.with_snapshot(self.base, found, warnings)

    def _drift(self) -> Drift | None:
        signature = envstate.dist_signature(self.prefix, self.sites)
        if signature == self.drift_signature:
            return self.drift
        try:
            now = envstate.environment_state(self.scan_vault, self.prefix, self.sites)
        except Exception as err:  # noqa: BLE001
            warn(f"cannot read the environment {self.prefix} for drift: {err}")
            now = None
        self.drift_signature = now.signature if now else signature
        self.drift = envstate.drift_between(self.start, self.start_signature, now, self.drift_signature)
        if self.drift:
            names = ", ".join(c.name for c in self.drift.changed) or "unknown"
            warn(f"the environment on disk changed since this process started ({names}); stamps say so")
        return self.drift


def _temporary_vault():
    import atexit
    import shutil
    import tempfile

    from envvault.vault.store import Vault

    path = tempfile.mkdtemp(prefix="envvault-stamp-")
    atexit.register(shutil.rmtree, path, True)
    return Vault.open(path, create=True)

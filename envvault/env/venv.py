"""A virtual environment (``python -m venv``, virtualenv, ``uv venv``), read: the one
``EnvironmentReader`` (``reader.py``) today.

The interpreter's answers come from ``probe`` (a subprocess), memoised while ``bin/python3``, ``bin/python``
and ``pyvenv.cfg`` keep their stats; the file facts come from ``pyvenv.cfg`` and the ``lib/pythonX.Y`` layout.
``envvault.env.dists`` (email, packaging) is imported only when a distribution is actually read: an
unchanged environment's snap never needs it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)

from envvault.env.probe import Interpreter, probe, read_pyvenv_cfg
from envvault.env.entries import entry_kind
from envvault.errors import UsageError

if TYPE_CHECKING:
    from envvault.env.dists import InstalledDist

__all__ = ["VenvReader"]


class VenvReader:
    """``EnvironmentReader`` for a virtual environment at ``prefix``."""

    kind = "venv"

    def __init__(self, prefix: Path, memo=None) -> None:
        """``memo``: a ``reader.Memo`` (the snap's stat cache) to keep the interpreter's answers in."""
        self.prefix = Path(prefix)
        self._memo = memo
        self._interp: Interpreter | None = None
        self.stashed: list[Path] = []

    # -- the interpreter's facts ------------------------------------------------------------------

    def interpreter(self) -> Interpreter:
        """``probe`` costs a subprocess; reuse its answer while pyvenv.cfg and the interpreter are
        unchanged (kept in the memo under ``probe``)."""
        if self._interp is None:
            self._interp = self._cached_probe()
        return self._interp

    def memoised_interpreter(self) -> Interpreter | None:
        """The interpreter's answers from the memo alone: None when it holds none for the environment as it
        is now (nothing is run; the quick ``status``, which then leaves the answer to the full command)."""
        if self._interp is None:
            key = self._probe_key()
            self._interp = None if key is None else self._memo_hit(key)
        return self._interp

    def _probe_key(self) -> list | None:
        """What a memoised probe answer holds for: the prefix as given, the real path and stat key of each of
        the names the interpreter is run by (``probe.VENV_PYTHONS``: the one ``probe`` runs, and the other,
        which a user's ``python`` may run; either one relinked is a new key), and ``pyvenv.cfg``'s; None when
        they cannot be read or the environment has neither name."""
        from envvault.env.probe import VENV_PYTHONS
        from envvault.vault.statcache import stat_key

        prefix = self.prefix
        # The prefix as given is part of the key: the memo is shared by every path of one environment
        # (its <key> is the real path), and the probe answers with paths under the prefix it was given.
        key: list = [str(prefix)]
        try:
            for name in VENV_PYTHONS:
                exe = prefix / "bin" / name
                key += [str(exe.resolve()), *stat_key(exe.stat())] if exe.exists() else [None]
            if key.count(None) == len(VENV_PYTHONS):
                return None
            cfg = prefix / "pyvenv.cfg"
            return key + (stat_key(cfg.stat()) if cfg.exists() else [])
        except OSError:
            return None

    def _memo_hit(self, key: list) -> Interpreter | None:
        """The memo's answer when it was kept under ``key``."""
        hit = self._memo.extra.get("probe") if self._memo is not None else None
        if isinstance(hit, dict) and hit.get("key") == key:
            try:
                return Interpreter.from_cache(self.prefix, hit["value"])
            except (KeyError, TypeError, AttributeError, ValueError):
                pass
        return None

    def _cached_probe(self) -> Interpreter:
        memo = self._memo
        key = None if memo is None else self._probe_key()
        if key is None:
            return probe(self.prefix)
        interp = self._memo_hit(key)
        if interp is None:
            interp = probe(self.prefix)
            memo.extra["probe"] = {"key": key, "value": interp.to_cache()}
            memo.mark_dirty()
        return interp

    def site_dirs(self) -> list[Path]:
        interp = self.interpreter()
        return [interp.purelib, interp.platlib]

    # -- distributions ----------------------------------------------------------------------------

    def dist_entries(self) -> list[tuple[Path, Path]]:
        out, seen = [], set()
        self.stashed = []
        for site in self.site_dirs():
            if site in seen or not site.is_dir():
                continue
            seen.add(site)
            for entry in os.scandir(site):
                kind = entry_kind(entry.name)
                if kind == "dist":
                    out.append((Path(entry.path), site))
                elif kind in ("stash", "unnamed"):
                    self.stashed.append(Path(entry.path))
        out.sort(key=lambda t: t[0].name)
        return out

    def read(self, entry: Path, site: Path) -> InstalledDist | None:
        from envvault.env.dists import read_any

        return read_any(entry, site)

    def distributions(self) -> list[InstalledDist]:
        found = (self.read(entry, site) for entry, site in self.dist_entries())
        return [d for d in found if d is not None]

    # -- the files' facts (nothing runs) ----------------------------------------------------------

    def python_version(self) -> str | None:
        """From ``pyvenv.cfg`` (``version_info`` or ``version``), else from the ``lib/pythonX.Y`` folder
        name (then only ``X.Y``); None when neither says."""
        values = read_pyvenv_cfg(self.prefix)
        for key in ("version_info", "version"):
            m = re.match(r"(\d+\.\d+(?:\.\d+)?)", values.get(key, ""))
            if m:
                return m.group(1)
        libs = sorted(p.name for p in (self.prefix / "lib").glob("python3*") if p.is_dir())
        for name in libs:
            m = re.fullmatch(r"python(\d+\.\d+)t?", name)
            if m:
                return m.group(1)
        return None

    def site_packages(self) -> Path:
        """``lib/pythonX.Y/site-packages`` (the version's own first), else ``Lib/site-packages``."""
        venv = self.prefix
        version = self.python_version()
        candidates = sorted((venv / "lib").glob("python3*/site-packages")) + [venv / "Lib" / "site-packages"]
        if version:
            mm = ".".join(version.split(".")[:2])
            candidates.sort(key=lambda p: p.parent.name not in (f"python{mm}", f"python{mm}t"))
        for path in candidates:
            if path.is_dir():
                return path
        raise UsageError(f"{venv} is not a virtual environment: no site-packages under it")

"""An interpreter's own installation, read as that interpreter sees it (docs/format.md, "Environment
kinds"): every site directory (the user site when enabled, the prefix's site-packages, Debian's
``dist-packages``), each distribution tagged with its installer, ``debian`` where dpkg owns its folder.

The environment's ``prefix`` (its root) is the deepest folder holding the interpreter's prefix and every site
and scripts folder; paths of the snapshot are relative to it, as a venv's are to the venv. The interpreter's
answers come from ``probe.probe_system`` (run isolated), memoised while the executable keeps its stats and
the user-site variables their values.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from envvault.env.probe import Interpreter, probe_system
from envvault.env.entries import entry_kind
from envvault.errors import UsageError
from envvault.model import records

if TYPE_CHECKING:
    from envvault.env.dists import InstalledDist

__all__ = ["SystemReader"]



def _project(entry_name: str) -> str:
    """The normalised project name of a distribution entry's file name (``six-1.16.0.egg-info``)."""
    import re

    stem = entry_name.rsplit(".", 1)[0]
    return re.sub(r"[-_.]+", "-", stem.split("-", 1)[0]).lower()


def _is_hex(rec) -> bool:
    """Debian's packaging writes some RECORDs with hex sha256 digests, not the urlsafe base64 of the spec."""
    d = rec.digest
    return rec.algo == "sha256" and d is not None and len(d) == 64 and all(c in "0123456789abcdef" for c in d)


def _b64(rec):
    """``rec`` with its hex sha256 as RECORD's base64, so the file's hash compares with it."""
    import base64

    digest = base64.urlsafe_b64encode(bytes.fromhex(rec.digest)).rstrip(b"=").decode("ascii")
    return records.replace(rec, digest=digest)


_USER_DIST: list = []


def _in_user_site(dist, scripts: Path):
    """``dist`` (an ``InstalledDist``) answering ``layout`` and ``build_id`` with the user site's scripts
    folder, whatever scripts folder the caller names."""
    if not _USER_DIST:
        from envvault.env.dists import InstalledDist

        @records.dataclass
        class UserSiteDist(InstalledDist):
            user_scripts: Path = Path("bin")

            def layout(self, scripts_dir: Path):
                return InstalledDist.layout(self, self.user_scripts)

            def build_id(self, scripts_dir: Path) -> str:
                return InstalledDist.build_id(self, self.user_scripts)

        _USER_DIST.append(UserSiteDist)
    fields = {f.name: getattr(dist, f.name) for f in records.fields(dist)}
    return _USER_DIST[0](**fields, user_scripts=scripts)


class SystemReader:
    """``EnvironmentReader`` for the installation the interpreter ``exe`` runs; ``prefix`` is its root."""

    kind = "system"

    def __init__(self, prefix: Path, exe: Path, memo=None, interp: Interpreter | None = None) -> None:
        self.prefix = Path(prefix)
        self.exe = Path(exe)
        self._memo = memo
        self._fresh = interp  # the probe the command line just made, if any
        self._interp: Interpreter | None = None
        self._owners = None
        self.stashed: list[Path] = []

    # -- the interpreter's facts ------------------------------------------------------------------

    def interpreter(self) -> Interpreter:
        if self._interp is None:
            interp = self._cached_probe()
            if interp.prefix != self.prefix:
                raise UsageError(f"{self.exe} now sees the environment rooted at {interp.prefix}, not {self.prefix}")
            # Site directories are probed as candidates; the ones that exist now are the environment's.
            self._interp = interp._replace(sites=tuple(p for p in interp.sites if p.is_dir()))
        return self._interp

    def _key(self) -> list:
        from envvault.vault.statcache import stat_key

        real = os.path.realpath(self.exe)
        return ["system-probe-2", str(self.prefix), str(self.exe), real, *stat_key(os.stat(real)),
                os.environ.get("PYTHONUSERBASE"), os.environ.get("PYTHONNOUSERSITE"), os.environ.get("HOME")]

    def _cached_probe(self) -> Interpreter:
        memo = self._memo
        try:
            key = self._key()
        except OSError:
            key = None
        if memo is not None and key is not None:
            hit = memo.extra.get("probe")
            if hit and hit.get("key") == key:
                try:
                    return Interpreter.from_cache(self.prefix, hit["value"])
                except (KeyError, TypeError):
                    pass
        interp = self._fresh or probe_system(self.exe)
        if memo is not None and key is not None:
            memo.extra["probe"] = {"key": key, "value": interp.to_cache()}
            memo.mark_dirty()
        return interp

    def site_dirs(self) -> list[Path]:
        return list(self.interpreter().sites)

    # -- distributions ----------------------------------------------------------------------------

    def dist_entries(self) -> list[tuple[Path, Path]]:
        """Every site directory's entries; a project already found in an earlier site directory (the user
        site shadows the system's) is the one Python imports, and the only one listed."""
        out: list[tuple[Path, Path]] = []
        self.stashed = []
        seen_sites: set[Path] = set()
        earlier: set[str] = set()
        for site in self.site_dirs():
            if site in seen_sites:
                continue
            seen_sites.add(site)
            here: set[str] = set()
            try:
                entries = list(os.scandir(site))
            except OSError:
                continue
            # A dist-info first: Debian ships some projects with both (``cryptography.egg-info`` beside
            # ``cryptography-38.0.4.dist-info``); the egg-info then adds nothing.
            entries.sort(key=lambda e: (not e.name.endswith(".dist-info"), e.name))
            for entry in entries:
                kind = entry_kind(entry.name)
                if kind in ("stash", "unnamed"):
                    self.stashed.append(Path(entry.path))
                if kind != "dist":
                    continue
                name = _project(entry.name)
                if name in earlier or (name in here and not entry.name.endswith(".dist-info")):
                    continue
                here.add(name)
                out.append((Path(entry.path), site))
            earlier |= here
        out.sort(key=lambda t: (t[0].name, str(t[1])))
        return out

    def owners(self):
        """dpkg's owners of the files under this environment's site and scripts folders."""
        if self._owners is None:
            from envvault.env.dpkg import owners_under

            interp = self.interpreter()
            self._owners = owners_under(tuple(str(p) for p in (*interp.sites, interp.scripts)))
        return self._owners

    def read(self, entry: Path, site: Path) -> InstalledDist | None:
        from envvault.env.dists import read_any

        dist = read_any(entry, site)
        if dist is None:
            return None
        if not dist.installer and self.owners().owner(str(entry)):
            dist = records.replace(dist, installer="debian")
        if dist.record and any(_is_hex(r) for r in dist.record):
            dist = records.replace(dist, record=[_b64(r) if _is_hex(r) else r for r in dist.record])
        user_site = self.interpreter().user_site
        if user_site is not None and site == user_site:
            # pip --user puts scripts in <user base>/bin, not the interpreter's scripts folder: the identity
            # rules must leave those out of the build id as they do for the prefix's (one wheel, one build id).
            dist = _in_user_site(dist, user_site.parents[2] / "bin")
        return dist

    def distributions(self) -> list[InstalledDist]:
        found = (self.read(entry, site) for entry, site in self.dist_entries())
        return [d for d in found if d is not None]

    # -- the files' facts --------------------------------------------------------------------------

    def python_version(self) -> str | None:
        return self.interpreter().version

    def site_packages(self) -> Path:
        interp = self.interpreter()
        for path in (interp.purelib, *interp.sites):
            if path.is_dir():
                return path
        raise UsageError(f"{self.exe} has no site directory")

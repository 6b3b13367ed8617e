"""Where installed wheels came from: pip's ``--report`` gives each wheel's URL and sha256; the index is the
configured index that served it. Kept in guard snapshots under ``provenance`` so ``export`` can write
``url`` and ``index`` for those packages.

A snapshot's ``provenance`` maps a normalized name to a :class:`~envvault.model.provenance.ProvenanceEntry`
(``url``, ``sha256``, ``index``, ``version``, ``build_id``; ``index`` may be null: a ``--find-links`` or direct
URL install). An entry is true only for the build named by ``build_id``: entries are carried from snapshot to
snapshot while that build stays installed.
"""

from __future__ import annotations

import configparser
from envvault.model import records
import os
import urllib.parse
from pathlib import Path
from typing import Iterable, Mapping

from envvault.env.dists import read_dist
from envvault.guard.command import Command
from envvault.guard.plan import PlannedDist
from envvault.model.provenance import ProvenanceEntry

__all__ = ["pip_indexes", "index_for", "report_provenance", "current_builds", "carry"]

PYPI = "https://pypi.org/simple"
_PYPI_FILES = "files.pythonhosted.org"


def _strip_auth(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _config_files(env: Mapping[str, str], venv: Path | None) -> list[Path]:
    """pip's configuration files, lowest priority first (pip's ``configuration.py``)."""
    explicit = env.get("PIP_CONFIG_FILE")
    if explicit == os.devnull:
        return []  # pip loads no file at all
    dirs = [d for d in env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":") if d]
    files = [Path(d) / "pip" / "pip.conf" for d in reversed(dirs)] + [Path("/etc/pip.conf")]
    home = Path(env.get("HOME", "~")).expanduser()
    files += [home / ".pip" / "pip.conf", Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
    if venv is not None:
        files.append(venv / "pip.conf")
    if explicit:
        files.append(Path(explicit))
    return files


def pip_indexes(cmd: Command, env: Mapping[str, str], venv: Path | None) -> list[str]:
    """The index URLs pip would use for ``cmd``: command line over environment over config files."""
    index: str | None = PYPI
    extras: list[str] = []
    for path in _config_files(env, venv):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, UnicodeDecodeError):
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                for key in ("index-url", "index_url"):
                    if parser.has_option(section, key):
                        index = parser.get(section, key).strip()
                for key in ("extra-index-url", "extra_index_url"):
                    if parser.has_option(section, key):
                        extras = parser.get(section, key).split()
                if parser.has_option(section, "no-index"):
                    index = None
    if env.get("PIP_INDEX_URL"):
        index = env["PIP_INDEX_URL"]
    if env.get("PIP_EXTRA_INDEX_URL"):
        extras = env["PIP_EXTRA_INDEX_URL"].split()
    args, i = list(cmd.args), 0
    while i < len(args):
        arg = args[i]
        name, _, inline = arg.partition("=")
        if name in ("-i", "--index-url", "--extra-index-url") or (arg.startswith("-i") and len(arg) > 2):
            if arg.startswith("-i") and len(arg) > 2 and not arg.startswith("--"):
                value = arg[2:]
            elif inline:
                value = inline
            else:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            if name == "--extra-index-url":
                extras.append(value)
            else:
                index = value
        elif arg == "--no-index":
            index, extras = None, []
        i += 1
    return [_strip_auth(u).rstrip("/") for u in ([index] if index else []) + extras if u]


def index_for(url: str | None, indexes: Iterable[str]) -> str | None:
    """The configured index that served ``url``: same host, longest shared path; PyPI for its file host."""
    if not url:
        return None
    target = urllib.parse.urlsplit(url)
    best, best_len = None, -1
    for index in indexes:
        parts = urllib.parse.urlsplit(index)
        same_host = (parts.scheme, parts.netloc) == (target.scheme, target.netloc)
        if target.netloc == _PYPI_FILES and parts.netloc == "pypi.org":
            same_host = True
        if not same_host:
            continue
        shared = len(os.path.commonprefix([parts.path, target.path]))
        if shared > best_len:
            best, best_len = index, shared
    return best


def report_provenance(installs: Iterable[PlannedDist], indexes: list[str]) -> dict[str, ProvenanceEntry]:
    """Provenance entries (without ``build_id``) for wheels pip's report names with a URL and a sha256."""
    out = {}
    for p in installs:
        if not p.url or not p.sha256:
            continue
        url = _strip_auth(p.url)
        out[p.name] = ProvenanceEntry(url=url, sha256=p.sha256, index=index_for(url, indexes), version=p.version)
    return out


def current_builds(prefix: Path, sites: Iterable[Path], names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """``{name: (version, build_id)}`` for the named distributions installed now (RECORD only, no hashing)."""
    wanted = set(names)
    out: dict[str, tuple[str, str]] = {}
    if not wanted:
        return out
    for site in dict.fromkeys(sites):
        try:
            entries = os.listdir(site)
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith(".dist-info"):
                continue
            stem = entry[: -len(".dist-info")].rsplit("-", 1)[0]
            if stem.lower().replace("_", "-").replace(".", "-") not in wanted:
                continue
            try:
                dist = read_dist(site / entry, site)
            except Exception:  # a damaged dist-info is the snapshot's to report, not provenance's
                continue
            if dist.name in wanted:
                out[dist.name] = (dist.version, dist.build_id(prefix / "bin"))
    return out


def carry(entries: Mapping[str, ProvenanceEntry],
          builds: Mapping[str, tuple[str, str]]) -> dict[str, ProvenanceEntry]:
    """Entries still true of what is installed: same version, and the same build when the entry names one."""
    out = {}
    for name, entry in entries.items():
        now = builds.get(name)
        if now is None or entry.version != now[0]:
            continue
        if entry.build_id and entry.build_id != now[1]:
            continue
        out[name] = records.replace(entry, build_id=now[1])
    return out

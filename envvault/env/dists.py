"""Scan installed distributions: dist-info metadata and RECORD, the way pip and uv leave them.

Nothing here reads file contents beyond the dist-info folder (and a torch-like ``version.py``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Container
from envvault.model.records import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name

from envvault.errors import CorruptError, EnvironmentProblem
from envvault.model.identity import GENERATED_NAMES, DistLayout, build_id, egg_link_build_id, is_bytecode
from envvault.model.record import RecordEntry, parse_record
from envvault.model.encoding import json_loads
from envvault.env.static import read_env_file

__all__ = ["RecordEntry", "InstalledDist", "scan_dists", "read_dist", "read_egg_info", "read_egg_link",
           "read_any", "dist_entries"]


@dataclass
class InstalledDist:
    name: str  # normalized
    version: str
    dist_info: Path  # absolute
    site: Path  # the directory RECORD paths are relative to
    installer: str | None
    requested: bool
    wheel: dict
    direct_url: dict | None
    record: list[RecordEntry] | None  # None: no RECORD (egg-info / distutils)
    scripts: set[str] = field(default_factory=set)  # console/gui script names (launchers are generated)
    kind: str = "dist-info"  # or "egg-info", or "egg-link" (an old-style editable: dist_info is the .egg-link)
    target: str | None = None  # egg-link: the folder its files live in, outside the environment
    # RECORD's rows as written, when ``record`` took hashes RECORD lacks from an installer's cache
    # (``_with_cached_hashes``): the build id is of these, whether or not that cache is still there
    written_rows: list[RecordEntry] | None = None
    # the paths of the rows RECORD lists without a hash, in a distribution pdm linked into its cache (its
    # RECORD lists ``REFER_TO``): what their files hold enters the state id (``snap/manifests.py``)
    hashless: frozenset[str] = frozenset()

    @property
    def display(self) -> str:
        return f"{self.name} {self.version}"

    def layout(self, scripts_dir: Path) -> DistLayout:
        """What ``envvault.model.identity`` needs to tell this distribution's generated rows."""
        return DistLayout.of(self.dist_info.name, str(self.site), str(scripts_dir), self.scripts)

    def build_id(self, scripts_dir: Path) -> str:
        """The build id (docs/format.md, "build id"), from RECORD alone."""
        if self.kind == "egg-link":
            return egg_link_build_id(self.target or "")
        rows = self.written_rows if self.written_rows is not None else self.record
        return build_id(rows or (), self.layout(scripts_dir))


def _read_text(path: Path) -> str | None:
    """A dist-info file's text; a FIFO, a device or a file over 64 MiB is refused in one line, never waited
    on or read whole (a site folder may be writable by others)."""
    try:
        data = read_env_file(path)
    except FileNotFoundError:
        return None
    except CorruptError as err:
        raise EnvironmentProblem(str(err)) from None
    except OSError as err:
        raise EnvironmentProblem(f"cannot read {path}: {err.strerror}") from None
    return data.decode("utf-8", errors="replace")


def _broken(dist_info: Path, what: str) -> EnvironmentProblem:
    """The one line for a dist-info folder envvault cannot read, with both ways out: reinstall then snap, or
    (helper 29: a restore could not repair it) remove the folder, after which a restore writes that package
    back whole."""
    return EnvironmentProblem(f"{what}; reinstall that package (pip install --force-reinstall) and snap again, or, "
                              f"to restore a snapshot over it, remove {dist_info} and run the restore again")


def _parse_record(text: str, where: Path) -> list[RecordEntry]:
    entries, problems = parse_record(text)
    if problems:
        shown = "; ".join(map(str, problems[:5])) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise _broken(where.parent, f"{where} is garbled ({shown})")
    return entries


def _entry_point_scripts(dist_info: Path) -> set[str]:
    text = _read_text(dist_info / "entry_points.txt")
    if not text:
        return set()
    names, section = set(), None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section in ("console_scripts", "gui_scripts") and "=" in line:
            names.add(line.split("=", 1)[0].strip())
    return names


# A dist-info folder's name as installers write it (the wheel spec's escaping: ``-`` in neither part)
_FOLDER_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?", re.ASCII)
_FOLDER_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.!+_]*", re.ASCII)


def _named_by_folder(dist_info: Path) -> tuple[str, str]:
    """The name and version a dist-info folder's name gives (``{name}-{version}.dist-info``, the wheel spec's
    escaping), for a distribution whose METADATA is gone though its RECORD lists it: a file like any other
    that a restore puts back (an installer's cache that METADATA was a symlink into, pruned: uv's
    ``--link-mode symlink``). An EnvironmentProblem when the name gives none."""
    name, sep, version = dist_info.name[: -len(".dist-info")].partition("-")
    if not (sep and _FOLDER_NAME.fullmatch(name) and _FOLDER_VERSION.fullmatch(version)):
        raise _broken(dist_info, f"{dist_info}/METADATA is missing")
    return name, version


def read_dist(dist_info: Path, site: Path) -> InstalledDist:
    """Parse one ``*.dist-info`` folder. Missing or garbled RECORD, or garbled METADATA, is an
    EnvironmentProblem; a missing METADATA too, unless RECORD lists it (``_named_by_folder``)."""
    meta_text = _read_text(dist_info / "METADATA")
    if meta_text is None:
        name, version = _named_by_folder(dist_info)
    else:
        headers = HeaderParser().parsestr(meta_text, headersonly=True)
        name, version = headers.get("Name"), headers.get("Version")
        if not name or not version or "\n" in name or "\n" in version:
            raise _broken(dist_info, f"{dist_info}/METADATA is garbled (no Name or Version)")
    record_text = _read_text(dist_info / "RECORD")
    if record_text is None:
        raise _broken(dist_info, f"{dist_info}/RECORD is missing, so the files of {name} are unknown")
    record = _parse_record(record_text, dist_info / "RECORD")
    written, hashless = None, frozenset()
    refer = f"{dist_info.name}/REFER_TO"  # pdm's, naming its cached copy: one lstat a distribution, else nothing
    if os.path.lexists(dist_info / "REFER_TO") and any(r.path == refer for r in record):
        own = {f"{dist_info.name}/{name}" for name in GENERATED_NAMES}  # (the installer's own files aside)
        hashless = frozenset(r.path for r in record if r.algo is None and r.path not in own
                             and not is_bytecode(r.path))
        filled = _with_cached_hashes(dist_info, site, record) if hashless else None
        if filled is not None:
            record, written = filled, record
    if meta_text is None and not any(r.path == f"{dist_info.name}/METADATA" for r in record):
        raise _broken(dist_info, f"{dist_info}/METADATA is missing")  # and RECORD never listed it
    wheel: dict = {"tags": [], "build": None, "generator": None, "root_is_purelib": None}
    wheel_text = _read_text(dist_info / "WHEEL")
    if wheel_text:
        wh = HeaderParser().parsestr(wheel_text, headersonly=True)
        wheel = {
            "tags": wh.get_all("Tag") or [],
            "build": wh.get("Build"),
            "generator": wh.get("Generator"),
            "root_is_purelib": (wh.get("Root-Is-Purelib") or "").strip().lower() == "true",
        }
    direct_url = None
    du_text = _read_text(dist_info / "direct_url.json")
    if du_text:
        try:
            direct_url = json_loads(du_text)
        except ValueError:
            direct_url = {"unparsable": du_text[:200]}
    installer = (_read_text(dist_info / "INSTALLER") or "").strip() or None
    return InstalledDist(
        name=canonicalize_name(name),
        version=version.strip(),
        dist_info=dist_info,
        site=site,
        installer=installer,
        requested=(dist_info / "REQUESTED").exists(),
        wheel=wheel,
        direct_url=direct_url,
        record=record,
        scripts=_entry_point_scripts(dist_info),
        written_rows=written,
        hashless=hashless,
    )


def _with_cached_hashes(dist_info: Path, site: Path, record: list[RecordEntry]) -> list[RecordEntry] | None:
    """RECORD's rows, those without a hash given the hash the installer's cached copy of the wheel gives for
    the same file (the same path, or, for a file the wheel ships under ``.data/``, the path in the wheel its
    symlink leads to) and size; None when there is no such copy. pdm's ``symlink`` cache method makes each file a
    symlink into its package cache and writes ``sha256=`` (no hash) for it; its ``REFER_TO`` names that
    cached copy, whose own RECORD (the wheel's) has every hash. With them the links are checked as any row
    is (``snap/manifests.py``): a link is stored as the package's file only when it leads to the very bytes
    a RECORD named before envvault read them, so a ``REFER_TO`` or a cached RECORD someone else wrote can
    make envvault store only bytes they already knew. Either file unreadable, garbled or not there: None."""
    try:
        refer = (_read_text(dist_info / "REFER_TO") or "").strip()
        if not refer.startswith("/") or "\n" in refer or "\0" in refer:
            return None
        text = read_env_file(Path(refer) / dist_info.name / "RECORD").decode("utf-8", errors="replace")
    except (OSError, ValueError, EnvironmentProblem, CorruptError):
        return None
    cached, problems = parse_record(text)
    if problems:
        return None
    known = {r.path: r for r in cached if r.algo is not None}
    inside = refer.rstrip("/") + "/"
    out = []
    for r in record:
        c = known.get(r.path) if r.algo is None else None
        if c is None and r.algo is None:  # (installed elsewhere than the wheel has it: ``.data/``; rare)
            try:
                to = os.readlink(os.path.join(site, r.path))
            except (OSError, ValueError):
                to = ""
            c = known.get(to[len(inside):]) if to.startswith(inside) else None
        if c is not None and (r.size is None or c.size is None or r.size == c.size):
            r = RecordEntry(r.path, c.algo, c.digest, r.size if r.size is not None else c.size)
        out.append(r)
    return out


def read_egg_info(path: Path, site: Path) -> InstalledDist | None:
    meta = path / "PKG-INFO" if path.is_dir() else path
    text = _read_text(meta)
    if text is None:
        return None
    headers = HeaderParser().parsestr(text, headersonly=True)
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        return None
    return InstalledDist(
        name=canonicalize_name(name), version=version.strip(), dist_info=path, site=site, installer=None,
        requested=False, wheel={"tags": [], "build": None, "generator": None, "root_is_purelib": None},
        direct_url=None, record=None, kind="egg-info",
    )


def read_egg_link(path: Path, site: Path) -> InstalledDist:
    """An old-style editable (``pip install --no-use-pep517 -e``, ``setup.py develop``): ``<name>.egg-link``
    names the folder holding the project's ``<name>.egg-info``; the files stay in that folder. Metadata that
    cannot be read there (project moved or deleted) leaves the version ``unknown``."""
    text = _read_text(path) or ""
    target = next((line.strip() for line in text.splitlines() if line.strip()), "")
    stem = canonicalize_name(path.name[: -len(".egg-link")])
    folder = (site / target) if target else None
    found = None
    if folder is not None:
        try:
            candidates = sorted(folder.glob("*.egg-info"))
        except OSError:
            candidates = []
        for cand in candidates:
            if canonicalize_name(cand.name[: -len(".egg-info")].split("-")[0]) == stem:
                found = read_egg_info(cand, site)
                break
    name, version = (found.name, found.version) if found is not None else (stem, "unknown")
    return InstalledDist(
        name=name, version=version, dist_info=path, site=site, installer=None, requested=False,
        wheel={"tags": [], "build": None, "generator": None, "root_is_purelib": None},
        direct_url=None, record=None, kind="egg-link", target=str(folder.resolve()) if folder else "",
    )


def dist_entries(site: Path) -> list[Path]:
    """The distribution entries of one site directory: ``*.dist-info``, ``*.egg-info`` and ``*.egg-link``."""
    return [Path(e.path) for e in os.scandir(site) if e.name.endswith((".dist-info", ".egg-info", ".egg-link"))]


def read_any(entry: Path, site: Path) -> InstalledDist | None:
    """``read_dist``, ``read_egg_info`` or ``read_egg_link`` by the entry's suffix (None: unreadable egg-info)."""
    if entry.name.endswith(".egg-link"):
        return read_egg_link(entry, site)
    if entry.name.endswith(".egg-info"):
        return read_egg_info(entry, site)
    return read_dist(entry, site)


def scan_dists(sites: list[Path], skip: Container[Path] = ()) -> list[InstalledDist]:
    """Every distribution in the given site directories (less the entries in ``skip``), sorted by name."""
    dists: list[InstalledDist] = []
    seen: set[Path] = set()
    for site in sites:
        if site in seen or not site.is_dir():
            continue
        seen.add(site)
        for entry in sorted(dist_entries(site)):
            if entry in skip or entry.name.endswith(".dist-info") and not entry.is_dir():
                continue
            dist = read_any(entry, site)
            if dist is not None:
                dists.append(dist)
    dists.sort(key=lambda d: (d.name, d.version))
    return dists


_VERSION_FIELDS = re.compile(r"^(__version__|cuda|git_version|hip|debug)\s*(?::\s*[^=]+)?=\s*(.+)$", re.M)


def build_info(dist: InstalledDist) -> dict | None:
    """For torch and torch-like packages: the fields of ``<pkg>/version.py`` (read as text, never executed)."""
    if not dist.record:
        return None
    top = dist.name.replace("-", "_")
    wanted = f"{top}/version.py"
    if not any(e.path == wanted for e in dist.record):
        return None
    text = _read_text(dist.site / wanted)
    if not text:
        return None
    found = {}
    for key, raw in _VERSION_FIELDS.findall(text):
        raw = raw.strip()
        if raw.startswith(("'", '"')) and raw[-1:] == raw[0]:
            found[key.strip("_")] = raw[1:-1]
        elif raw in ("None", "True", "False"):
            found[key.strip("_")] = None if raw == "None" else raw == "True"
    if "cuda" not in found and "git_version" not in found:
        return None
    return found

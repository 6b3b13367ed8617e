"""The snapshot document (docs/format.md, "Snapshots") as typed, frozen records.

``parse_snapshot(doc, where)`` is the one validating parser: it raises a CorruptError listing every problem
with its place (``packages[3].build_id: expected a 64-hex string``; the list is the error's ``problems``),
a UsageError for a newer format. ``Snapshot.to_dict()`` writes the canonical form back: exactly the
document parsed (known keys it lacked stay absent, unknown keys come back from ``extra``), so ids never
change. ``build_snapshot`` is the one constructor of a new document (snap, cache snap, guard, restore
backups). Pure: no I/O.
"""

from __future__ import annotations

import re
from envvault.model.records import dataclass, field
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Mapping

from envvault.errors import UsageError
from envvault.model._fields import (
    NO_EXTRA, OPT_STRS, STRS, Key, check_bool, check_dict, check_hex_id, check_int, check_list, check_num,
    check_opt_dict,
    check_opt_hex_id, check_opt_int, check_opt_list, check_opt_str, check_opt_str_list, check_str, check_str_list,
    check_str_map, dump_fields, is_id, load_fields, load_record, raise_problems, record_loader,
)
from envvault.model.encoding import canonical_json, recordable
from envvault.model.provenance import ProvenanceEntry, load_provenance

__all__ = ["FORMAT", "Snapshot", "PackageSummary", "PythonInfo", "settings_of", "Host", "Gpu", "Stats", "CacheEntry", "GuardInfo",
           "parse_snapshot", "parse_package_summary", "snapshot_problems", "build_snapshot", "is_id", "as_snapshot",
           "as_python", "as_package", "loose_snapshot",
           "tag_name_problem"]

FORMAT = 1
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HEXISH = re.compile(r"[0-9a-fA-F]+")
_EMPTY: frozenset[str] = frozenset()


def tag_name_problem(name: str) -> str | None:
    """Why ``name`` is not a tag name (docs/format.md, "Ids on the command line"), or None when it is one."""
    if not isinstance(name, str) or _TAG.fullmatch(name) is None:
        return "use 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit"
    if name == "latest":
        return "'latest' names the newest snapshot"
    if _HEXISH.fullmatch(name):
        return "a name of hex digits only would read as an id prefix"
    return None


def _record(cls):
    """``to_dict`` from the class's key table."""
    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, cls.KEYS)

    cls.to_dict = to_dict
    return cls


def _nested(parse):
    """A ``Key.load`` parsing a nested object with ``parse(obj, where, problems)``."""
    return lambda v, where, problems: parse(v, where + ".", problems)


def _nested_list(parse):
    def load(v, where, problems):
        out = []
        for i, item in enumerate(v):
            at = f"{where}[{i}]"
            if not isinstance(item, dict):
                problems.append(f"{at}: expected an object")
                continue
            out.append(parse(item, at + ".", problems))
        return tuple(out)
    return load


# -- python -------------------------------------------------------------------------------------------------

# pyvenv.cfg keys that change how a venv behaves (``PythonInfo.venv_settings``); the others describe the
# interpreter found. ``seed``: uv's ``uv venv --seed`` (uv keeps pip, setuptools and wheel through a sync).
VENV_SETTINGS = ("include-system-site-packages", "prompt", "seed")
_SYSTEM_KEYS = ("environment", "prefix", "sites", "user_site", "build", "interpreter")
_PY_PATHS = ("implementation", "version", "abi", "soabi", "platform", "executable", "platlib", "purelib",
             "scripts", "base_prefix")


@_record
@dataclass(frozen=True, slots=True, kw_only=True)
class PythonInfo:
    """The interpreter a snapshot was taken with. Paths are relative to the venv when inside it. Every field
    is None in a cache-only snapshot (no interpreter recorded)."""

    implementation: str | None = None
    version: str | None = None
    abi: str | None = None
    soabi: str | None = None
    platform: str | None = None
    executable: str | None = None
    platlib: str | None = None
    purelib: str | None = None
    scripts: str | None = None
    base_prefix: str | None = None
    pyvenv_cfg: Mapping[str, Any] | None = None
    # A system environment's (docs/format.md, "Environment kinds"); absent in a venv's snapshot.
    environment: str | None = None
    prefix: str | None = None
    sites: tuple[str, ...] | None = None
    user_site: str | None = None
    build: str | None = None
    interpreter: str | None = None
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = tuple(Key(k, check_opt_str) for k in _PY_PATHS) + (Key("pyvenv_cfg", check_opt_dict),) + tuple(
        Key(k, check_opt_str) for k in _SYSTEM_KEYS if k != "sites") + (Key("sites", check_opt_str_list, load=OPT_STRS),)

    @classmethod
    def unknown(cls) -> PythonInfo:
        """A cache-only snapshot's: the five interpreter fields, all null, and nothing else."""
        return cls(absent=frozenset(_PY_PATHS[5:]) | {"pyvenv_cfg"} | frozenset(_SYSTEM_KEYS))

    @property
    def system(self) -> bool:
        """True for an interpreter's own installation (``environment`` "system"), False for a venv."""
        return self.environment == "system"

    @property
    def minor(self) -> str | None:
        """``3.11`` of ``3.11.7``."""
        return ".".join(self.version.split(".")[:2]) if self.version else None

    def venv_settings(self) -> dict[str, Any] | None:
        """The ``pyvenv.cfg`` settings that change how the environment behaves (``VENV_SETTINGS``), as
        recorded: None for a key absent (``include-system-site-packages``: "false", lowercased, as ``site``
        reads it); None when no pyvenv.cfg was recorded. The one rule of what ``diff`` and ``status`` compare
        and ``restore`` puts back of that file. Values are as the document holds them (checked by the caller
        that writes them)."""
        return settings_of(self.pyvenv_cfg) if self.pyvenv_cfg else None

    def exact_version(self) -> str:
        """``version`` when it is one as the probe records it (``X.Y.Z``), else a CorruptError: what finds an
        interpreter for it (``restore --into``) or writes it into a lockfile (``export``) takes no other text
        from a vault that may be anyone's (a path, a word)."""
        if not isinstance(self.version, str) or not _VERSION.fullmatch(self.version):
            from envvault.errors import CorruptError

            raise CorruptError(f"the snapshot's Python version {self.version!r:.60} is not a version (X.Y.Z); refused")
        return self.version


_VERSION = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,4}")


def settings_of(cfg: dict) -> dict[str, Any]:
    """``VENV_SETTINGS`` as the pyvenv.cfg ``cfg`` (its keys and values) sets them (``venv_settings``'s rule, for
    a file read from disk too: an empty one sets every key to its default)."""
    got = {k: cfg.get(k) for k in VENV_SETTINGS}
    flag = got["include-system-site-packages"]
    got["include-system-site-packages"] = "false" if not flag else flag.lower() if isinstance(flag, str) else flag
    return got
_parse_python = record_loader(PythonInfo)


# -- host ---------------------------------------------------------------------------------------------------

@_record
@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    name: str = ""
    compute_cap: str | None = None
    memory: str | None = None
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = (Key("name", check_str, True, ""), Key("compute_cap", check_opt_str), Key("memory", check_opt_str))


_parse_gpu = record_loader(Gpu)


@_record
@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """Host facts (``envvault/env/host.py``); ``nvidia_smi`` is ``"failed"`` when nvidia-smi failed."""

    hostname: str | None = None
    os: str | None = None
    arch: str | None = None
    glibc: str | None = None
    cpus: int | None = None
    gpus: tuple[Gpu, ...] | None = None
    driver: str | None = None
    nvidia_smi: str | None = None
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = (Key("hostname", check_opt_str), Key("os", check_opt_str), Key("arch", check_opt_str),
            Key("glibc", check_opt_str), Key("cpus", check_opt_int),
            Key("gpus", check_opt_list, load=lambda v, w, p: None if v is None else _nested_list(_parse_gpu)(v, w, p)),
            Key("driver", check_opt_str), Key("nvidia_smi", check_opt_str))


_parse_host = record_loader(Host)


# -- stats --------------------------------------------------------------------------------------------------

@_record
@dataclass(frozen=True, slots=True, kw_only=True)
class Stats:
    files: int | float = 0
    bytes: int | float = 0
    new_bytes: int | float = 0
    new_objects: int | float = 0
    seconds: int | float = 0
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = tuple(Key(k, check_num, default=0) for k in ("files", "bytes", "new_bytes", "new_objects", "seconds"))


_parse_stats = record_loader(Stats)


# -- caches -------------------------------------------------------------------------------------------------

@_record
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheEntry:
    """One archived cache root in a snapshot (docs/format.md, "Caches in a snapshot"). ``manifest`` is None
    when the cache could not be read; ``fingerprint`` is the cache fingerprint as stored (a dict)."""

    kind: str = ""
    root: str = ""
    reason: str | None = None
    manifest: str | None = None
    files: int = 0
    bytes: int = 0
    entries: Mapping[str, Any] | None = None
    fingerprint: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = ()
    seconds: int | float | None = None
    reused: bool | None = None
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = (Key("kind", check_str, default=""), Key("root", check_str, default=""), Key("reason", check_opt_str),
            Key("manifest", check_opt_hex_id), Key("files", check_int, default=0), Key("bytes", check_int, default=0),
            Key("entries", check_opt_dict), Key("fingerprint", check_opt_dict),
            Key("warnings", check_str_list, default=(), load=STRS),
            Key("seconds", lambda v: None if v is None else check_num(v)),
            Key("reused", lambda v: None if v is None else check_bool(v)))


_parse_cache = record_loader(CacheEntry)


# -- guard --------------------------------------------------------------------------------------------------

@_record
@dataclass(frozen=True, slots=True, kw_only=True)
class GuardInfo:
    """What guard adds: ``phase`` ``before`` or ``after``, the guarded ``command``; after: its ``exit_code``
    and the id of the ``before`` snapshot."""

    phase: str = ""
    command: tuple[str, ...] = ()
    exit_code: int | None = None
    before: str | None = None
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = (Key("phase", check_str, True, ""), Key("command", check_str_list, default=(), load=STRS),
            Key("exit_code", check_opt_int), Key("before", check_opt_hex_id))


_parse_guard = record_loader(GuardInfo)


# -- packages -----------------------------------------------------------------------------------------------

@_record
@dataclass(frozen=True, slots=True, kw_only=True)
class PackageSummary:
    """One distribution of a snapshot (docs/format.md, "Snapshots" and the glossary). ``identity``: the
    identity version of its ids (1 when absent); ``scripts``: its scripts id; ``exec``: paths of its files
    with an execute bit, or None when no mode was recorded (lock-only, or older snapshots)."""

    name: str
    version: str
    build_id: str
    state_id: str
    manifest: str
    identity: int = 1
    scripts: str | None = None
    build_info: Mapping[str, Any] | None = None
    files: int = 0
    size: int = 0
    modified: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    exec: tuple[str, ...] | None = None
    installer: str | None = None
    record: str = "ok"
    requested: bool = False
    site: str | None = None  # a system environment's: the site directory it lies in
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = (Key("name", check_str, True, ""), Key("version", check_str, True, ""),
            Key("build_id", check_hex_id, True, ""), Key("state_id", check_hex_id, True, ""),
            Key("manifest", check_hex_id, True, ""), Key("identity", check_int, default=1),
            Key("scripts", check_opt_str), Key("build_info", check_opt_dict),
            Key("files", check_int, default=0), Key("size", check_int, default=0),
            Key("modified", check_str_list, default=(), load=STRS), Key("missing", check_str_list, default=(), load=STRS),
            Key("exec", check_opt_str_list, load=OPT_STRS), Key("installer", check_opt_str),
            Key("record", check_str, default="ok"), Key("requested", check_bool, default=False),
            Key("site", check_opt_str))

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.version)


_PACKAGE_KEYS = frozenset(k.name for k in PackageSummary.KEYS)
_ID_MATCH = re.compile(r"[0-9a-f]{64}").fullmatch


def _strs_or_none(v: Any) -> tuple[str, ...] | None:
    """``v`` as a tuple when it is a list of strings, else None."""
    if type(v) is list and all(type(x) is str for x in v):
        return tuple(v)
    return None


def _fast_package(obj: dict) -> PackageSummary | None:
    """The summary every snapshot of today's format holds (every key, each of its type, nothing more), read
    without the generic engine (loading every snapshot is what ``list`` and ``status`` pay); None for
    anything else, which the generic parser then reads and reports."""
    if len(obj) != 16 or "site" in obj or not _PACKAGE_KEYS.issuperset(obj):
        return None
    g = obj.__getitem__
    name, version, build, state, man = g("name"), g("version"), g("build_id"), g("state_id"), g("manifest")
    identity, scripts, info, files, size = g("identity"), g("scripts"), g("build_info"), g("files"), g("size")
    installer, record, requested, exe = g("installer"), g("record"), g("requested"), g("exec")
    modified, missing = _strs_or_none(g("modified")), _strs_or_none(g("missing"))
    ok = (type(name) is str and type(version) is str and type(build) is str and _ID_MATCH(build) is not None
          and type(state) is str and _ID_MATCH(state) is not None and type(man) is str and _ID_MATCH(man) is not None
          and type(identity) is int and (scripts is None or type(scripts) is str)
          and (info is None or type(info) is dict) and type(files) is int and type(size) is int
          and (installer is None or type(installer) is str) and type(record) is str and type(requested) is bool
          and modified is not None and missing is not None)
    if not ok:
        return None
    if exe is not None:
        exe = _strs_or_none(exe)
        if exe is None:
            return None
    return PackageSummary(name=name, version=version, build_id=build, state_id=state, manifest=man,
                          identity=identity, scripts=scripts, build_info=info, files=files, size=size,
                          modified=modified, missing=missing, exec=exe, installer=installer, record=record,
                          requested=requested, absent=_NO_SITE)


_NO_SITE = frozenset({"site"})  # a venv's summary: no site key (docs/format.md, "Environment kinds")


def parse_package_summary(obj: Any, where: str, problems: list[str]) -> PackageSummary | None:
    """One package summary; problems (placed under ``where``, e.g. ``packages[3].``) are appended."""
    if not isinstance(obj, dict):
        problems.append(f"{where.rstrip('.')}: expected an object")
        return None
    fast = _fast_package(obj)
    if fast is not None:
        return fast
    return load_record(PackageSummary, obj, where, problems)


def _packages(v, where, problems):
    out = []
    for i, item in enumerate(v):
        p = parse_package_summary(item, f"{where}[{i}].", problems)
        if p is not None:
            out.append(p)
    return tuple(out)


# -- the snapshot -------------------------------------------------------------------------------------------

@_record
@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """A snapshot document. ``kind`` is ``snapshot`` or ``cache-snapshot``; ``caches`` is None when the
    document holds null; ``host`` and ``stats`` None when absent. Unknown keys are in ``extra``."""

    format: int = FORMAT
    kind: str = "snapshot"
    created: str = ""
    message: str = ""
    trigger: str | None = None
    argv: tuple[str, ...] = ()
    venv: str | None = None
    lock_only: bool = False
    python: PythonInfo = field(default_factory=PythonInfo)
    host: Host | None = None
    env: Mapping[str, str] = NO_EXTRA
    packages: tuple[PackageSummary, ...] = ()
    caches: tuple[CacheEntry, ...] | None = ()
    fingerprint: str | None = None
    warnings: tuple[str, ...] = ()
    stats: Stats | None = None
    tool: Mapping[str, Any] | None = None
    guard: GuardInfo | None = None
    provenance: Mapping[str, ProvenanceEntry] | None = None  # guard's (model/provenance.py)
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = (
        Key("format", check_int, True, FORMAT), Key("kind", check_str, default="snapshot"),
        Key("created", check_str, True, ""), Key("message", check_str, default=""),
        Key("trigger", check_opt_str), Key("argv", check_str_list, default=(), load=STRS),
        Key("venv", check_opt_str, True), Key("lock_only", check_bool, default=False),
        Key("python", check_dict, True, PythonInfo(), load=_nested(_parse_python)),
        Key("host", check_dict, load=_nested(_parse_host)),
        Key("env", check_str_map, default=NO_EXTRA),
        Key("packages", check_list, True, (), load=_packages),
        Key("caches", check_opt_list, default=(),
            load=lambda v, w, p: None if v is None else _nested_list(_parse_cache)(v, w, p)),
        Key("fingerprint", check_opt_str), Key("warnings", check_str_list, default=(), load=STRS),
        Key("stats", check_dict, load=_nested(_parse_stats)), Key("tool", check_opt_dict),
        Key("guard", check_dict, load=_nested(_parse_guard)), Key("provenance", check_opt_dict, load=load_provenance),
    )

    # -- questions readers ask -------------------------------------------------------------------------
    @property
    def system_interpreter(self) -> str | None:
        """A system environment's interpreter (several may share a root: each counts apart); None for a venv."""
        py = self.python
        return py.interpreter if py is not None and py.system else None

    @property
    def is_cache_only(self) -> bool:
        return self.kind == "cache-snapshot"

    def package(self, name: str) -> PackageSummary | None:
        """The first package of that (normalised, as stored) name, or None."""
        return next((p for p in self.packages if p.name == name), None)

    def manifest_ids(self) -> list[str]:
        """Every object id of a manifest the snapshot references: package manifests, then cache trees."""
        return [p.manifest for p in self.packages] + [c.manifest for c in self.caches or () if c.manifest]

    def to_json(self) -> bytes:
        """The canonical bytes whose BLAKE3 is the snapshot's id."""
        return canonical_json(self.to_dict())


def snapshot_problems(doc: Any) -> list[str]:
    """Every way ``doc`` differs from the snapshot shape, each with its place; empty when it fits."""
    problems: list[str] = []
    _parse(doc, problems)
    return problems


def _parse(doc: Any, problems: list[str]) -> Snapshot | None:
    if not isinstance(doc, dict):
        problems.append("expected a JSON object")
        return None
    kw, absent, extra = load_fields(doc, Snapshot.KEYS, "", problems)
    return Snapshot(**kw, extra=extra, absent=absent)


def parse_snapshot(doc: Any, where: str = "snapshot") -> Snapshot:
    """The snapshot in ``doc`` (a parsed JSON document). A CorruptError ``<where> is malformed (...)`` names
    every problem with its place; a UsageError says a newer envvault wrote it."""
    if isinstance(doc, dict) and isinstance(doc.get("format"), int) and doc["format"] > FORMAT:
        raise UsageError(f"{where} was written by a newer envvault; upgrade envvault")
    problems: list[str] = []
    snap = _parse(doc, problems)
    raise_problems(where, problems)
    assert snap is not None
    return snap


def as_snapshot(doc: Any, where: str = "snapshot") -> Snapshot:
    """``doc`` itself when it is a ``Snapshot``, else parsed (for callers still holding the dict)."""
    return doc if isinstance(doc, Snapshot) else parse_snapshot(doc, where)


def loose_snapshot(doc: Any) -> Snapshot:
    """A ``Snapshot`` from an environment document that is no stored snapshot (the live scan of
    ``snap.scan_current``, a pylock.toml read by ``lock.pylock_doc.lockfile_document``): what does not fit is left
    at its default instead of refused (a package without ids gets ``""``), and a part that is null or absent
    (``python``, ``host``, ``env``) is named in ``absent``, so a comparison leaves it out."""
    if isinstance(doc, Snapshot):
        return doc
    if not isinstance(doc, dict):
        return Snapshot(absent=frozenset(k.name for k in Snapshot.KEYS))
    kw, absent, extra = load_fields(doc, Snapshot.KEYS, "", [])
    nulls = {k for k in ("python", "host", "env", "stats", "caches") if doc.get(k) is None}
    raw = doc.get("packages")
    kw["packages"] = tuple(_loose_package(p) for p in raw if isinstance(p, dict)) if isinstance(raw, list) else ()
    return Snapshot(**kw, extra=extra, absent=absent | nulls)


def _loose_id(v, where, problems) -> str:
    return v or ""


# A document that is no stored snapshot may name ids envvault did not compute (a pylock.toml's), or none.
_LOOSE_PACKAGE_KEYS = tuple(Key(k.name, check_opt_str, False, "", load=_loose_id)
                            if k.name in ("build_id", "state_id", "manifest") else k for k in PackageSummary.KEYS)


def _loose_package(obj: dict) -> PackageSummary:
    kw, absent, extra = load_fields(obj, _LOOSE_PACKAGE_KEYS, "", [])
    return PackageSummary(**kw, extra=extra, absent=absent)


def as_python(python: Any) -> PythonInfo:
    """A ``PythonInfo`` from itself or from a snapshot's ``python`` dict."""
    if isinstance(python, PythonInfo):
        return python
    problems: list[str] = []
    info = _parse_python(python if isinstance(python, dict) else {}, "python.", problems)
    raise_problems("python", problems)
    return info


def as_package(p: Any) -> PackageSummary:
    """A ``PackageSummary`` from itself or from its dict."""
    if isinstance(p, PackageSummary):
        return p
    problems: list[str] = []
    out = parse_package_summary(p, "", problems)
    raise_problems("package summary", problems)
    assert out is not None
    return out


def build_snapshot(*, kind: str = "snapshot", created: str, message: str, trigger: str | None,
                   argv: list[str], venv: str | None, lock_only: bool, python: Mapping[str, Any] | PythonInfo,
                   host: Mapping[str, Any] | Host, env: Mapping[str, str], packages: list, caches: list,
                   fingerprint: str | None, warnings: list[str], stats: Mapping[str, Any],
                   tool: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> Snapshot:
    """A new snapshot document, checked like a loaded one (a writer's bug is a CorruptError here, never a
    snapshot no reader loads). Parts may be records or the dicts they write; ``extra`` adds keys (guard's
    ``guard`` and ``provenance``). ``stats.new_bytes`` gets the document's own size added, as the format
    says ("the snapshot file itself")."""
    from envvault.model._fields import plain

    doc: dict[str, Any] = {
        "format": FORMAT, "kind": kind, "created": created, "message": recordable(message), "trigger": trigger,
        "argv": [recordable(a) for a in argv], "venv": venv, "lock_only": lock_only, "python": plain(python),
        "host": plain(host), "env": {k: recordable(v) for k, v in env.items()}, "packages": plain(packages), "caches": plain(caches), "fingerprint": fingerprint,
        "warnings": [recordable(w) for w in warnings], "stats": plain(stats), "tool": plain(tool),
    }
    if extra:
        doc.update(plain(extra))
    doc["stats"]["new_bytes"] += len(canonical_json(doc))
    return parse_snapshot(doc, f"new {kind}")

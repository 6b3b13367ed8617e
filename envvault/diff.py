"""What differs between two environment documents (snapshots, the live environment, a pylock.toml), as data.

``diff_snapshots(old, new)`` reads only the documents' package summaries, so diffing two 200-package
snapshots costs two JSON parses. With ``vault`` it also opens the two manifests of a package whose files
were edited in place, to name exactly the files whose bytes differ.
"""

from __future__ import annotations

from envvault.model.records import replace
from envvault.model.records import dataclass, field

from envvault.model.identity import same_build
from envvault.model.snapshot import VENV_SETTINGS, PackageSummary, Snapshot, loose_snapshot

__all__ = [
    "DiffResult",
    "exec_change",
    "PackageChange",
    "PackageRef",
    "diff_snapshots",
    "build_facts",
]

_PY_KEYS = ("implementation", "version", "abi", "soabi", "platform")
_PY_VIEW = _PY_KEYS + VENV_SETTINGS  # a venv's pyvenv.cfg settings too (``PythonInfo.venv_settings``)
_HOST_KEYS = ("os", "arch", "glibc", "hostname", "cpus", "driver", "driver_cuda", "gpus")


@dataclass(frozen=True)
class PackageRef:
    name: str
    version: str
    build_id: str | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.version, "build_id": self.build_id}


@dataclass(frozen=True)
class PackageChange:
    """One package present on both sides whose installed bytes differ.

    ``kind``: ``upgrade`` / ``downgrade`` (public version), ``local`` (only the local label, ``+cu128`` ->
    ``+cu130``), ``build`` (same version string, other RECORD), ``edited`` (same build, files edited in
    place, deleted or put back: ``modified_files``, ``missing_files``, ``put_back_files``), ``mode`` (same bytes, files that gained or lost the execute bit).
    """

    name: str
    old_version: str
    new_version: str
    kind: str
    build_changed: bool
    old_build_id: str | None
    new_build_id: str | None
    old_build_info: dict | None
    new_build_info: dict | None
    modified_files: tuple[str, ...] = ()
    missing_files: tuple[str, ...] = ()  # files ``new`` lacks that ``old`` had (deleted)
    mode_files: tuple[str, ...] = ()  # files whose execute bit differs (kind "mode" when nothing else does)
    put_back_files: tuple[str, ...] = ()  # files ``old`` lacked (recorded missing) that ``new`` has

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "old_version": self.old_version,
            "new_version": self.new_version,
            "kind": self.kind,
            "build_changed": self.build_changed,
            "old_build_id": self.old_build_id,
            "new_build_id": self.new_build_id,
            "build_facts": build_facts(self.old_build_info, self.new_build_info),
            "modified_files": list(self.modified_files),
            "missing_files": list(self.missing_files),
            "put_back_files": list(self.put_back_files),
            "mode_files": list(self.mode_files),
        }


@dataclass(frozen=True)
class DiffResult:
    """Differences from ``old`` to ``new``. ``python`` and ``host`` map a key to ``(old, new)``; ``env`` has
    ``added`` / ``removed`` ({name: value}) and ``changed`` ({name: (old, new)})."""

    old_label: str
    new_label: str
    added: tuple[PackageRef, ...] = ()
    removed: tuple[PackageRef, ...] = ()
    changed: tuple[PackageChange, ...] = ()
    python: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    @property
    def packages_empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    @property
    def environment_empty(self) -> bool:
        """Nothing differs in the environment itself (interpreter and packages)."""
        return self.packages_empty and not self.python

    @property
    def empty(self) -> bool:
        return self.environment_empty and not self.host and not any(self.env.values())

    def to_json(self) -> dict:
        return {
            "old": self.old_label,
            "new": self.new_label,
            "empty": self.empty,
            "packages": {
                "added": [p.to_json() for p in self.added],
                "removed": [p.to_json() for p in self.removed],
                "changed": [c.to_json() for c in self.changed],
            },
            "python": {k: {"old": o, "new": n} for k, (o, n) in self.python.items()},
            "host": {k: {"old": o, "new": n} for k, (o, n) in self.host.items()},
            "env": {
                "added": dict(self.env.get("added", {})),
                "removed": dict(self.env.get("removed", {})),
                "changed": {k: {"old": o, "new": n} for k, (o, n) in self.env.get("changed", {}).items()},
            },
        }


# -- computing -------------------------------------------------------------------------------------


def diff_snapshots(old: Snapshot | dict, new: Snapshot | dict, *, vault=None, old_label: str = "old",
                   new_label: str = "new", scope: str = "all") -> DiffResult:
    """Compare two environment documents: ``Snapshot`` records, or the dicts of the live environment
    (``envvault.snap.scan_current``) and of a pylock.toml (``lock.pylock_doc.lockfile_document``).
    ``scope="environment"`` leaves out host and environment variables (facts of the shell, not of the
    environment: what ``status`` and restore checks use)."""
    old, new = loose_snapshot(old), loose_snapshot(new)
    old_pk, new_pk = list(old.packages), list(new.packages)
    if old.lock_only or new.lock_only:
        # A lock-only snapshot recorded no file contents: each of its packages takes the contents a full
        # snapshot of the same build recorded (``content_states``); the others compare by version and build.
        old_pk, new_pk = _comparable(old_pk, old, new_pk, new, vault)
    added, removed, changed = _diff_packages(old_pk, new_pk, vault)
    python = _diff_keys(_python_view(old), _python_view(new), _PY_VIEW)
    host: dict = {}
    env: dict = {}
    if scope == "all":
        host = _diff_keys(_host_view(old), _host_view(new), _HOST_KEYS)
        env = _diff_env(None if "env" in old.absent else old.env, None if "env" in new.absent else new.env)
    return DiffResult(old_label, new_label, tuple(added), tuple(removed), tuple(changed), python, host, env)


def _no_contents(p: PackageSummary) -> PackageSummary:
    """A package summary without what only a full scan knows (state id, edited and missing files, modes)."""
    return replace(p, state_id="", modified=(), missing=(), exec=None)


def content_states(vault, doc: Snapshot | dict) -> dict[tuple[str, str], PackageSummary]:
    """For a lock-only snapshot ``doc``: ``{(name, build_id): package summary}`` of its packages as the newest
    full snapshot holding the same build recorded them (a restore's backup and a guard's rolled-back "after"
    snapshot last: they record states a restore undid; then one of the same environment first, then any; a
    snapshot taken no later than ``doc`` first): their contents (state id, edited, missing and executable
    files) stand for the lock-only ones. Packages of no stored full copy are absent."""
    if vault is None:
        return {}
    doc = loose_snapshot(doc)
    wanted = {(p.name, p.build_id) for p in doc.packages}
    created = doc.created
    from envvault.vault.heads import snapshot_heads

    from envvault.snap.verdict import undone_snapshots

    undone = undone_snapshots(vault)
    refs = [(sid, h) for sid, h in snapshot_heads(vault) if not h.lock_only and h.kind == "snapshot"]
    refs.sort(key=lambda r: (r[1].trigger != "restore-backup" and r[0] not in undone, r[1].venv == doc.venv,
                             r[1].created <= created, r[1].created), reverse=True)
    out: dict[tuple[str, str], PackageSummary] = {}
    for sid, _ in refs:  # read one by one: the first usually holds every build wanted
        ref = vault.load_listed(sid)
        if ref is None or ref.snapshot.lock_only or ref.snapshot.kind != "snapshot":  # (a forged summary)
            continue
        for p in ref.snapshot.packages:
            key = (p.name, p.build_id)
            if key in wanted and key not in out:
                out[key] = p
        if len(out) == len(wanted):
            break
    return out


def _comparable(old_pk: list[PackageSummary], old: Snapshot, new_pk: list[PackageSummary], new: Snapshot,
                vault) -> tuple[list[PackageSummary], list[PackageSummary]]:
    """Both package lists with what a lock-only side cannot know left out, name by name: a lock-only side's
    package with a stored full copy of its build takes that copy's contents; one without loses its content
    fields on both sides."""
    def fill(packages: list[PackageSummary], doc: Snapshot) -> tuple[list[PackageSummary], set[str]]:
        if not doc.lock_only:
            return packages, set()
        states = content_states(vault, doc)
        out, unknown = [], set()
        for p in packages:
            known = states.get((p.name, p.build_id))
            if known is None:
                unknown.add(p.name)
                out.append(p)
            else:
                out.append(replace(p, state_id=known.state_id, modified=known.modified, missing=known.missing,
                                   exec=known.exec))
        return out, unknown

    old_pk, unknown_old = fill(old_pk, old)
    new_pk, unknown_new = fill(new_pk, new)
    unknown = unknown_old | unknown_new
    strip = lambda pk: [_no_contents(p) if p.name in unknown else p for p in pk]  # noqa: E731
    return strip(old_pk), strip(new_pk)


def _by_name(packages: list[PackageSummary]) -> dict[str, list[PackageSummary]]:
    out: dict[str, list[PackageSummary]] = {}
    for p in packages:
        out.setdefault(p.name, []).append(p)
    return out


def _exec_of(p) -> tuple[str, ...] | None:
    if isinstance(p, PackageSummary):
        return p.exec
    value = p.get("exec") if isinstance(p, dict) else None  # a caller's {"exec": [...]}
    return tuple(value) if isinstance(value, (list, tuple)) else None


def exec_change(a: PackageSummary | dict, b: PackageSummary | dict) -> tuple[str, ...]:
    """Files of two states of a package whose execute bit differs (package summaries' ``exec``, see
    docs/format.md); empty when either side recorded no modes (older snapshots, lock-only ones)."""
    ea, eb = _exec_of(a), _exec_of(b)
    if ea is None or eb is None:
        return ()
    return tuple(sorted(set(ea) ^ set(eb)))


def _same_state(a: PackageSummary, b: PackageSummary) -> bool:
    if a.version != b.version:
        return False
    if exec_change(a, b):
        return False
    build = same_build(a, b)
    if build is False:
        return False
    if build and a.state_id and b.state_id and a.state_id != b.state_id:
        return False
    if build is None and a.build_id and b.build_id:  # ids of two identity versions
        return set(a.modified) == set(b.modified) and set(a.missing) == set(b.missing)
    if build:
        return set(a.missing) == set(b.missing)
    return True  # a side without build facts (a foreign pylock) can only be compared by version


def _diff_packages(old: list[PackageSummary], new: list[PackageSummary], vault) -> tuple[list, list, list]:
    old_by, new_by = _by_name(old), _by_name(new)
    added, removed, changed = [], [], []
    for name in sorted(old_by.keys() | new_by.keys()):
        o_list, n_list = list(old_by.get(name, ())), list(new_by.get(name, ()))
        # Pair identical entries first (several dist-infos of one name happen in damaged environments).
        for o in list(o_list):
            twin = next((n for n in n_list if _same_state(o, n)), None)
            if twin is not None:
                o_list.remove(o)
                n_list.remove(twin)
        while o_list and n_list:
            changed.append(_change(o_list.pop(0), n_list.pop(0), vault))
        removed += [PackageRef(p.name, p.version, p.build_id or None) for p in o_list]
        added += [PackageRef(p.name, p.version, p.build_id or None) for p in n_list]
    return added, removed, changed


def _parse_version(text: str):
    from packaging.version import InvalidVersion, Version  # imported here: status should start fast

    try:
        return Version(text)
    except InvalidVersion:
        return None


def _change(o: PackageSummary, n: PackageSummary, vault) -> PackageChange:
    ov, nv = o.version, n.version
    ob, nb = o.build_id or None, n.build_id or None
    build_changed = same_build(o, n) is False
    if ov != nv:
        pv_o, pv_n = _parse_version(ov), _parse_version(nv)
        if pv_o is not None and pv_n is not None and pv_o.public == pv_n.public:
            kind = "local"
        elif pv_o is not None and pv_n is not None and pv_n < pv_o:
            kind = "downgrade"
        else:
            kind = "upgrade"
    elif build_changed:
        kind = "build"
    else:
        kind = "edited"
    o_mod, n_mod = set(o.modified), set(n.modified)
    if build_changed or ov != nv:
        modified = sorted(n_mod)
    else:
        modified = _edited_files(o, n, o_mod, n_mod, vault)
    # Deleted (``new`` lacks them) apart from put back (``old`` recorded them missing): helper 29 saw a file put
    # back listed as missing, with a "-". Across versions or builds the two sides' RECORDs differ: the files
    # ``new`` lacks of its own are named, and none is "put back" (``new`` may not ship it at all).
    if build_changed or ov != nv:
        missing, put_back = sorted(n.missing), []
    else:
        missing, put_back = sorted(set(n.missing) - set(o.missing)), sorted(set(o.missing) - set(n.missing))
    # A mode change is one of a file both sides hold: another version or build is a change of its own (the
    # files of one version only are not "gained or lost the execute bit"), a missing file has no mode, and an
    # edited one is named as edited (a link whose target was pruned, say: it holds no execute bit, helper 38).
    gone = set(o.missing) | set(n.missing) | set(modified)
    modes = () if build_changed or ov != nv else tuple(f for f in exec_change(o, n) if f not in gone)
    if kind == "edited" and modes and not modified and not missing and not put_back:
        kind = "mode"
    return PackageChange(
        name=n.name, old_version=ov, new_version=nv, kind=kind, build_changed=build_changed,
        old_build_id=ob, new_build_id=nb, old_build_info=_plain_or_none(o.build_info),
        new_build_info=_plain_or_none(n.build_info),
        modified_files=tuple(modified), missing_files=tuple(missing), mode_files=modes,
        put_back_files=tuple(put_back),
    )


def _plain_or_none(info) -> dict | None:
    return dict(info) if info is not None else None


def _edited_files(o: PackageSummary, n: PackageSummary, o_mod: set, n_mod: set, vault) -> list[str]:
    """Files whose bytes differ between two states of one build."""
    if vault is not None:
        exact = _edited_from_manifests(o, n, vault)
        if exact is not None:
            return exact
    files = o_mod ^ n_mod
    if not files and o.state_id != n.state_id:
        files = o_mod & n_mod  # edited on both sides, differently
    return sorted(files)


def _edited_from_manifests(o: PackageSummary, n: PackageSummary, vault) -> list[str] | None:
    try:
        if not (o.manifest and n.manifest and vault.has(o.manifest) and vault.has(n.manifest)):
            return None
        om, nm = vault.load_manifest(o.manifest), vault.load_manifest(n.manifest)
    except Exception:  # noqa: BLE001 - a damaged manifest only costs precision here; verify reports it
        return None
    o_sha = {f.path: f.sha256 for f in om.files if f.state in ("ok", "modified")}
    n_sha = {f.path: f.sha256 for f in nm.files if f.state in ("ok", "modified")}
    return sorted(p for p in o_sha.keys() & n_sha.keys() if o_sha[p] != n_sha[p])


def _present(record, keys) -> dict:
    """``{key: value}`` of the keys a record's document held (typed fields not ``absent``, then ``extra``)."""
    out = {}
    for k in keys:
        if k in record.extra:
            out[k] = record.extra[k]
        elif hasattr(record, k) and k not in record.absent:
            out[k] = getattr(record, k)
    return out


def _python_view(doc: Snapshot) -> dict | None:
    """The interpreter's facts a diff compares, and the venv settings of its pyvenv.cfg where one was
    recorded (a key it lacks: "absent"; a document without pyvenv.cfg compares none of them)."""
    if "python" in doc.absent:
        return None
    view = _present(doc.python, _PY_KEYS)
    settings = doc.python.venv_settings()
    if settings is not None:
        view.update({k: "absent" if v is None else v for k, v in settings.items()})
    return view


def _host_view(doc: Snapshot) -> dict | None:
    host = doc.host
    if host is None or "host" in doc.absent:
        return None
    view = _present(host, _HOST_KEYS)
    if "gpus" in view:
        view["gpus"] = ", ".join(f"{g.name} (sm {g.compute_cap})" for g in host.gpus or ()) or "none"
    return view or None


def _diff_keys(old: dict | None, new: dict | None, keys) -> dict:
    if not old or not new:
        return {}
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k) and (k in old and k in new)}


def _diff_env(old, new) -> dict:
    if old is None or new is None:
        return {}
    out = {
        "added": {k: v for k, v in new.items() if k not in old},
        "removed": {k: v for k, v in old.items() if k not in new},
        "changed": {k: (old[k], new[k]) for k in old.keys() & new.keys() if old[k] != new[k]},
    }
    return {k: dict(sorted(v.items())) for k, v in out.items()}


def build_facts(old: dict | None, new: dict | None) -> dict:
    """``{field: [old, new]}`` for the torch-style build facts that differ (cuda, git_version, version...)."""
    old, new = old or {}, new or {}
    return {k: [old.get(k), new.get(k)] for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)}


def contents_note(vault, sid: str, doc: Snapshot | dict, *, changed: bool) -> str | None:
    """What a comparison with snapshot ``doc`` could not know: a lock-only snapshot recorded no file contents,
    so its packages were compared with full snapshots of the same builds (``diff.content_states``) where the
    vault holds one, by version and build only where not. None for a full snapshot."""
    doc = loose_snapshot(doc)
    if not doc.lock_only:
        return None
    total = len(doc.packages)
    known = len(content_states(vault, doc))
    if known == total:
        return f"baseline {sid[:12]} is lock-only: file contents compared with full snapshots of the same builds"
    tail = "only versions and builds were compared" if changed else "versions and builds unchanged"
    if known:
        return (f"baseline {sid[:12]} is lock-only: file contents of {known} of {total} packages compared with "
                f"full snapshots of the same builds; for the others, {tail}")
    return f"baseline {sid[:12]} is lock-only: file contents were not recorded; {tail}"

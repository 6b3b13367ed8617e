"""What a checkpoint stamp says, and how the environment behind it is named in the vault.

A stamp is a JSON object of plain types (format 1); readers ignore keys they do not know:

- ``snapshot``: full id of the vault snapshot of the environment the process started with (an existing one
  with the same fingerprint and venv, preferring a full one; else a lock-only snapshot taken at the first
  stamp while the files are vaulted by a detached ``envvault snap``), or null (vault unusable, or the
  environment changed before it could be vaulted); ``snapshot_lock_only``; ``vault``: where it was written;
- ``fingerprint``: lock-level fingerprint of that environment: the snapshot fingerprint over each
  distribution's name, version and build id (RECORD), computed from dist-info metadata alone, never by
  hashing installed files. A full snapshot of an environment without in-place edits has the same one;
- ``venv``, ``python``, ``executable``, ``torch`` (``str(torch.__version__)``), ``cuda``
  (``torch.version.cuda``), ``host``, ``argv``, ``cwd``, ``time`` (UTC, ISO 8601), ``env`` (chosen
  variables, credentials redacted), ``tool``, ``format``;
- ``git``: ``{root, commit, branch, dirty}`` of the work tree holding the cwd when the process first
  stamped, or null; read without running anything the repository configures (see :func:`git_state`);
  ``dirty`` counts tracked files only and is null when ``git`` is missing or slow or the repository's
  config holds more than plain settings;
- ``drift``: null, or ``{fingerprint, changed: [{name, old, new, other_build}]}`` when the environment on
  disk no longer matches the one the process started with (``old``/``new`` null for an install/removal);
- ``warnings``: what went wrong on the way (the vault could not be written...), also logged.

Top-level imports are standard library only: :mod:`envvault.torch.plugin` imports this module when
stamping is enabled, possibly at interpreter start-up.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from envvault import __version__
from envvault.errors import EnvvaultError, NotFoundError, UsageError
from envvault.vault.fsutil import read_regular

__all__ = [
    "STAMP_FORMAT",
    "EnvState",
    "Signature",
    "dist_signature",
    "environment_state",
    "state_from_cache",
    "find_snapshot",
    "lock_fingerprint",
    "ensure_snapshot",
    "drift_between",
    "git_state",
    "base_stamp",
    "snapshot_of",
]

STAMP_FORMAT = 1
# A cache under the vault's state/ (deleting it costs only speed):
#   {"tool": ..., "version": 3, "snapshots": {id: [fingerprint, lock_only, created, venv]},
#    "states": {key of (prefix, python, signature): [fingerprint, [[name, version, build id], ...]]}}
_INDEX_NAME = "stamp-index.json"
_ENTRY_LEN = 7  # see find_snapshot
_INDEX_VERSION = 4  # 3: identity version 2 (build ids leave scripts out); 4: missing files and trigger kept
_MAX_STATES = 64
_GIT_TIMEOUT = 2.0

# (dist-info directory relative to the prefix, RECORD stat key, METADATA stat key); stat keys as in the
# stat cache: [size, mtime_ns, inode, ctime_ns], or None for a missing file.
Signature = tuple[tuple[str, "list[int] | None", "list[int] | None"], ...]


@dataclass(frozen=True)
class EnvState:
    """The environment at one moment: its lock-level fingerprint and (name, version, build id) per package."""

    prefix: str
    python: str
    fingerprint: str
    packages: tuple[tuple[str, str, str], ...]
    signature: Signature


# --- the environment ------------------------------------------------------------------------------------


def _stat_key(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def dist_signature(prefix: Path, sites: list[Path]) -> Signature:
    """The dist-info directories of ``sites`` with the stats of their RECORD and METADATA: equal
    signatures mean no distribution was installed, removed or rewritten. Standard library only; costs a
    directory listing and two stats per distribution."""
    out = []
    seen = set()
    for site in sites:
        if site in seen:
            continue
        seen.add(site)
        try:
            entries = os.scandir(site)
        except OSError:
            continue
        with entries:
            for e in entries:
                if e.name.endswith((".dist-info", ".egg-info", ".egg-link")):
                    rel = os.path.relpath(e.path, prefix).replace(os.sep, "/")
                    out.append((rel, _stat_key(e.path + "/RECORD"), _stat_key(e.path + "/METADATA")))
    out.sort()
    return tuple(out)


def _python_version() -> str:
    return "%d.%d.%d" % sys.version_info[:3]


def state_from_cache(vault, prefix: Path, signature: Signature) -> EnvState | None:
    """The state described by ``signature``, from the vault's stat cache for ``prefix`` when every
    distribution in it was scanned before with exactly these RECORD / METADATA stats; else None.

    Works after the environment on disk has moved on, which is how the fingerprint at process start is
    recovered when the first save comes after a change. Reads the cache only, never the environment.
    """
    known = _load_index(vault)["states"].get(_state_key(prefix, signature))
    if known is not None:
        return EnvState(str(prefix), _python_version(), known[0], tuple(tuple(p) for p in known[1]), signature)
    from envvault.snap import statcache_for

    groups = statcache_for(vault, prefix).groups  # a full snap's cache: megabytes of JSON for a big venv
    packages = []
    for key, record, meta in signature:
        group = groups.get(key) or {}
        lock = group.get("lock") or {}
        if record is not None and lock.get("record_stat") == record and lock.get("meta_stat") == meta:
            summary = lock.get("summary") or {}
        elif record is not None and group.get("record_stat") == record and group.get("meta_stat") == meta:
            summary = group.get("summary") or {}  # a full or check scan: the same RECORD gives the same build id
        else:
            return None
        if not all(isinstance(summary.get(k), str) for k in ("name", "version", "build_id")):
            return None
        packages.append((summary["name"], summary["version"], summary["build_id"]))
    return _state(vault, prefix, packages, signature)


def _state_key(prefix: Path, signature: Signature) -> str:
    import hashlib

    return hashlib.sha256(json.dumps([str(prefix), _python_version(), signature]).encode()).hexdigest()


def _state(vault, prefix: Path, packages: list[tuple[str, str, str]], signature: Signature) -> EnvState:
    """The state of these packages, remembered in the index so the next process skips the stat cache."""
    from envvault.snap import fingerprint

    packages.sort()
    # A lock-level fingerprint: the state id of a package read from RECORD alone is its build id.
    fp = fingerprint(_python_version(), [{"name": n, "version": v, "state_id": b} for n, v, b in packages])
    index = _load_index(vault)
    states = index["states"]
    states.pop(_state_key(prefix, signature), None)
    states[_state_key(prefix, signature)] = [fp, [list(p) for p in packages]]
    for old in list(states)[: max(0, len(states) - _MAX_STATES)]:  # oldest first
        del states[old]
    _save_index(vault, index)
    return EnvState(str(prefix), _python_version(), fp, tuple(packages), signature)


def environment_state(vault, prefix: Path, sites: list[Path]) -> EnvState:
    """The environment at ``prefix`` now. Served from the stat cache when the dist-info files are as the
    last scan saw them; otherwise a lock-only scan (dist-info only), whose findings warm the cache."""
    from envvault.snap import scan_environment

    for _ in range(3):
        before = dist_signature(prefix, sites)
        cached = state_from_cache(vault, prefix, before)
        if cached is not None:
            return cached
        _interp, packages, _warnings, cache, _ing, _stats = scan_environment(vault, prefix, mode="lock")
        cache.save()
        after = dist_signature(prefix, sites)
        if after == before:  # nothing was installed while the scan ran
            return _state(vault, prefix, [(p["name"], p["version"], p["build_id"]) for p in packages], after)
    raise EnvvaultError(f"{prefix} kept changing while envvault read it (an install in progress?)")


def drift_between(start: EnvState | None, start_signature: Signature, now: EnvState | None,
                  now_signature: Signature) -> dict | None:
    """What changed on disk since the process started, or None. Distributions are named from the states
    when both are known, else from the dist-info directory names."""
    if start is not None and now is not None:
        if start.fingerprint == now.fingerprint:
            return None
        old = {n: (v, b) for n, v, b in start.packages}
        new = {n: (v, b) for n, v, b in now.packages}
        changed = []
        for name in sorted(old.keys() | new.keys()):
            o, n = old.get(name), new.get(name)
            if o != n:
                changed.append({"name": name, "old": o[0] if o else None, "new": n[0] if n else None,
                                "other_build": bool(o and n and o[0] == n[0])})
        return {"fingerprint": now.fingerprint, "changed": changed}
    if start_signature == now_signature:
        return None
    old_dirs = {d: (r, m) for d, r, m in start_signature}
    new_dirs = {d: (r, m) for d, r, m in now_signature}
    changed = []
    for d in sorted(old_dirs.keys() | new_dirs.keys()):
        if old_dirs.get(d) != new_dirs.get(d):
            name, _, version = Path(d).name.rsplit(".", 1)[0].partition("-")
            changed.append({"name": name, "old": version if d in old_dirs else None,
                            "new": version if d in new_dirs else None, "other_build": d in old_dirs and d in new_dirs})
    return {"fingerprint": now.fingerprint if now else None, "changed": changed}


# --- snapshots -------------------------------------------------------------------------------------------


def _load_index(vault) -> dict:
    try:
        doc = json.loads(read_regular(vault.state_path(_INDEX_NAME), 64 << 20, "stamp index"))
    except (OSError, ValueError, EnvvaultError):
        doc = None
    if not isinstance(doc, dict) or doc.get("tool") != __version__ or doc.get("version") != _INDEX_VERSION:
        doc = {}
    return {"tool": __version__, "version": _INDEX_VERSION,
            "snapshots": doc.get("snapshots") if isinstance(doc.get("snapshots"), dict) else {},
            "states": doc.get("states") if isinstance(doc.get("states"), dict) else {}}


def _save_index(vault, index: dict) -> None:
    from envvault.vault.fsutil import atomic_write

    data = json.dumps(index, separators=(",", ":")).encode()
    try:
        atomic_write(vault.state_path(_INDEX_NAME), data, tmp_dir=vault.root / "tmp", durable=False)
    except EnvvaultError:
        pass  # a cache: the next process does the work again


def lock_fingerprint(doc: dict) -> str | None:
    """A snapshot's lock-level fingerprint (what stamps carry): its fingerprint with each package's build id
    in place of its state id. Equal to ``fingerprint`` for a lock-only snapshot and for a full one without
    edits; a full snapshot of an environment with edited files (an appended CA in certifi) differs only here."""
    from envvault.snap import fingerprint

    python = doc.get("python") or {}
    packages = doc.get("packages")
    if doc.get("fingerprint") is None or not isinstance(packages, list) or not python.get("version"):
        return None
    try:
        return fingerprint(python["version"], [{"name": p["name"], "version": p["version"], "state_id": p["build_id"]}
                                               for p in packages])
    except (KeyError, TypeError):
        return None


def find_snapshot(vault, fingerprint: str, venv: str | None = None) -> tuple[str, bool] | None:
    """``(id, lock_only)`` of a snapshot with this lock-level fingerprint (see ``lock_fingerprint``; of the
    environment at ``venv`` when given: an identical copy elsewhere would make ``restore`` target that
    copy). The lock-level fingerprint reads dist-info only, so a snapshot of a damaged environment (files
    deleted, as in the backup a restore takes before repairing it) can share it: the order is a full one
    before a lock-only one, one without missing files before one with, one not taken as a restore's backup
    before a backup, then the newest.

    The index under ``state/`` remembers each snapshot's facts (snapshot files never change; entries
    ``[fingerprint, lock_only, created, venv, lock fingerprint, missing files, trigger]``, others are read
    again), so each snapshot document is read once per vault, not once per process.
    """
    index = _load_index(vault)
    known = index["snapshots"]
    ids = set(vault.snapshot_ids())
    changed = not known.keys() <= ids
    for sid in ids:
        entry = known.get(sid)
        if isinstance(entry, list) and len(entry) == _ENTRY_LEN:
            continue
        try:
            doc = vault.load_snapshot(sid).doc
        except EnvvaultError:
            continue
        missing = sum(len(p.get("missing") or ()) for p in doc.get("packages") or () if isinstance(p, dict))
        known[sid] = [doc.get("fingerprint"), bool(doc.get("lock_only")), str(doc.get("created", "")),
                      str(doc.get("venv", "")), lock_fingerprint(doc), missing, str(doc.get("trigger", ""))]
        changed = True
    if changed:
        index["snapshots"] = {sid: v for sid, v in known.items() if sid in ids}
        _save_index(vault, index)
    matches = [(not entry[1], entry[5] == 0, entry[6] != "restore-backup", entry[2], sid)
               for sid, entry in known.items()
               if sid in ids and len(entry) == _ENTRY_LEN and entry[4] == fingerprint and (venv is None or entry[3] == venv)]
    if not matches:
        return None
    best = max(matches)
    return best[-1], not best[0]


@contextmanager
def _flock(path: Path) -> Iterator[None]:
    from envvault.vault.fsutil import flocked, storage_error

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise storage_error(err, path) from None
    with flocked(path, exclusive=True):
        yield


def ensure_snapshot(vault, prefix: Path, state: EnvState, *, full_snapshot: bool = True,
                    runtime_path: list[str] | None = None) -> tuple[str, bool]:
    """``(id, lock_only)`` of a snapshot of ``state``: an existing one with its fingerprint, else a
    lock-only snapshot taken now and, with ``full_snapshot``, a detached ``envvault snap`` that vaults the
    files without making the caller wait.

    Concurrent callers (threads or processes) serialise on ``locks/stamp-<fingerprint>.lock`` and look again
    once they hold it, so they produce one snapshot between them. Raises :class:`EnvvaultError` when the
    vault cannot be written or the environment changed before it could be vaulted.
    """
    found = find_snapshot(vault, state.fingerprint, state.prefix)
    if found:
        return found
    from envvault.snap import take_snapshot

    with _flock(vault.root / "locks" / f"stamp-{state.fingerprint}.lock"):
        found = find_snapshot(vault, state.fingerprint, state.prefix)
        if found:
            return found
        result = take_snapshot(vault, prefix, lock_only=True, trigger="stamp", argv=list(sys.argv),
                               message=f"for checkpoint stamps (pid {os.getpid()})")
        if result.doc.get("fingerprint") != state.fingerprint:
            raise EnvvaultError(f"{prefix} changed before it could be vaulted (snapshot {result.id[:12]} has "
                                "another fingerprint); the stamp names no snapshot")
        find_snapshot(vault, state.fingerprint)  # index the new snapshot for the processes waiting on the lock
        if full_snapshot:
            try:
                spawn_full_snapshot(vault, prefix, state.fingerprint, runtime_path or [])
            except (OSError, subprocess.SubprocessError) as err:  # the stamp's snapshot stands without it
                logging.getLogger("envvault").warning(
                    "envvault: could not start `envvault snap` of %s in the background (%s); run it yourself to "
                    "store the files", prefix, err)
        return result.id, True


def spawn_full_snapshot(vault, prefix: Path, fingerprint: str, runtime_path: list[str]) -> None:
    """Start ``envvault snap`` of ``prefix`` in its own session, detached (it outlives the caller); its
    stderr goes to ``state/stamp-snap.log`` in the vault."""
    log = vault.state_path("stamp-snap.log")
    # The environment stays the training process's (the snapshot records it); envvault's own import path
    # goes on the command line instead of PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "ENVVAULT_STAMP"}
    from envvault.env.untrusted import boot_code  # the current folder off sys.path: it may hold a json.py

    boot = boot_code(runtime_path)
    cmd = [sys.executable, "-c", boot, "--vault", str(vault.root), "snap", "--venv", str(prefix),
           "--no-caches", "-m", f"files for checkpoint stamps ({fingerprint[:12]})"]
    # sh starts the snap in the background and exits at once: the snap is re-parented, never a zombie here.
    subprocess.run(["/bin/sh", "-c", 'exec 2>>"$0"; "$@" </dev/null >/dev/null &', str(log), *cmd],
                   env=env, start_new_session=True, check=True, timeout=30)


# --- the rest of the stamp -------------------------------------------------------------------------------


def git_state(start: Path) -> dict | None:
    """Commit, branch and dirty flag of the git work tree holding ``start``, or None outside one.

    Nothing a repository configures runs: the commit and branch are read from ``.git`` files (HEAD, refs,
    packed-refs; bounded reads of regular files, refs checked for shape). Only the dirty flag runs
    ``git status`` (tracked files only), and only when the repository's config holds nothing but plain
    settings (:func:`_plain_config`), with fsmonitor, the untracked cache, hooks, system config, optional
    locks, submodules and lazy fetches off; None otherwise, or when git is missing or slow. The repository
    may be one the user owns but did not write (an unpacked archive) and ``start`` any folder a training
    process runs in.
    """
    root = next((d for d in (start, *start.parents) if (d / ".git").exists()), None)
    if root is None:
        return None
    unknown = {"root": str(root), "commit": None, "branch": None, "dirty": None}
    gitdir = root / ".git"
    if gitdir.is_file():  # a worktree or submodule: "gitdir: <path>"
        text = _git_text(gitdir)
        if text is None or not text.startswith("gitdir:"):
            return unknown
        gitdir = (root / text[len("gitdir:"):].strip()).resolve()
    common = gitdir
    text = _git_text(gitdir / "commondir")
    if text is not None:
        common = (gitdir / text.strip()).resolve()
    head = _git_text(gitdir / "HEAD")
    if head is None:
        return unknown
    head = head.strip()
    branch, commit = None, _object_id(head)
    if head.startswith("ref:"):
        ref = head[4:].strip()
        if not _ref_name(ref):
            return unknown
        branch = ref.removeprefix("refs/heads/")
        commit = _read_ref(gitdir, common, ref)
    dirty = _git_dirty(root) if _plain_config(gitdir, common) else None
    return {"root": str(root), "commit": commit, "branch": branch, "dirty": dirty}


_GIT_SMALL = 1 << 16  # HEAD, a loose ref, a gitdir or commondir file
_GIT_LARGE = 16 << 20  # packed-refs, config


def _git_text(path: Path, limit: int = _GIT_SMALL) -> str | None:
    """The text of a regular file of at most ``limit`` bytes; None for anything else (missing, a FIFO,
    a device, too large, unreadable)."""
    from envvault.torch.checkpoint import read_small

    try:
        raw = read_small(path, limit)
    except (OSError, EnvvaultError):
        return None
    return None if raw is None else raw.decode("utf-8", "replace")


def _object_id(text: str) -> str | None:
    text = text.strip()
    return text if len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text) else None


def _ref_name(ref: str) -> bool:
    parts = ref.split("/")
    return ref.startswith("refs/") and len(ref) < 1024 and all(p not in ("", ".", "..") for p in parts)


def _read_ref(gitdir: Path, common: Path, ref: str) -> str | None:
    for base in (gitdir, common):
        text = _git_text(base / ref)
        if text is not None:
            return _object_id(text)
    text = _git_text(common / "packed-refs", _GIT_LARGE)
    for line in (text or "").splitlines():
        sha, _, name = line.partition(" ")
        if name.strip() == ref:
            return _object_id(sha)
    return None  # a branch without commits yet


# The repository settings under which `git status` runs nothing the repository names: section -> keys.
# Anything else (core.fsmonitor, core.hooksPath, filter.*, include.*, remote.*.uploadpack, a promisor
# remote...) or a config envvault cannot parse leaves `dirty` null.
_PLAIN_CONFIG = {
    "core": {"repositoryformatversion", "filemode", "bare", "logallrefupdates", "ignorecase", "precomposeunicode",
             "symlinks", "autocrlf", "eol", "safecrlf", "quotepath", "checkstat", "trustctime", "abbrev",
             "compression", "loosecompression", "bigfilethreshold", "sparsecheckout", "sparsecheckoutcone",
             "preloadindex", "warnambiguousrefs", "whitespace", "commentchar"},
    "remote": {"url", "pushurl", "fetch", "push", "tagopt", "prune", "mirror", "skipdefaultupdate"},
    "branch": {"remote", "merge", "rebase", "pushremote", "description"},
    "user": {"name", "email"},
    "init": {"defaultbranch"},
    "pull": {"rebase", "ff"},
    "push": {"default", "autosetupremote"},
    "fetch": {"prune"},
    "gc": {"auto"},
    "index": {"version"},
    "extensions": {"objectformat", "worktreeconfig"},
    "submodule": {"url", "active", "path", "branch"},
}


def _plain_config(gitdir: Path, common: Path) -> bool:
    """True when every setting in the repository's config files is in :data:`_PLAIN_CONFIG`."""
    for path in {common / "config", gitdir / "config", common / "config.worktree", gitdir / "config.worktree"}:
        if not os.path.lexists(path):
            continue
        text = _git_text(path, _GIT_LARGE)
        if text is None:
            return False
        try:
            if any(key not in _PLAIN_CONFIG.get(section, ()) for section, key in _config_keys(text)):
                return False
        except ValueError:
            return False
    return True


def _config_keys(text: str) -> Iterator[tuple[str, str]]:
    """``(section, key)``, lower case, of every setting in git config ``text``. Conservative: each line is
    read on its own (a continued value then reads as a setting, or fails), and anything else raises
    ValueError."""
    import re

    section = ""
    for raw in text.removeprefix("\ufeff").splitlines():
        line = raw.strip()
        while line and line[0] not in "#;":
            if line[0] == "[":
                end, quoted = 1, False
                while end < len(line) and (quoted or line[end] != "]"):
                    quoted ^= line[end] == '"'
                    end += 1
                if end >= len(line):
                    raise ValueError("unterminated section")
                header = line[1:end].strip()
                section = header.split(None, 1)[0].split(".", 1)[0].lower() if header else ""
                line = line[end + 1 :].strip()
                continue
            match = re.match(r"[A-Za-z][A-Za-z0-9-]*(?=\s*(=|$|[#;]))", line)
            if match is None or not section:
                raise ValueError(f"not a setting: {line[:40]!r}")
            yield section, match.group(0).lower()
            break


def _git_dirty(root: Path) -> bool | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_OPTIONAL_LOCKS="0", GIT_NO_LAZY_FETCH="1", GIT_TERMINAL_PROMPT="0")
    cmd = ["git", "--no-optional-locks", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false",
           "-c", f"core.hooksPath={os.devnull}", "-c", "submodule.recurse=false", "-c", "protocol.allow=never",
           "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--ignore-submodules=all"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=_GIT_TIMEOUT, env=env,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def base_stamp(*, state: EnvState | None, snapshot: tuple[str, bool] | None, vault_root: str | None,
               prefix: Path, warnings: list[str]) -> dict[str, Any]:
    """The fields of a stamp that stay the same for the whole process (plain JSON types only: a
    ``TorchVersion`` would make ``torch.load(weights_only=True)`` refuse the checkpoint)."""
    from envvault.env.host import relevant_env

    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    return {
        "format": STAMP_FORMAT,
        "tool": f"envvault {__version__}",
        "snapshot": snapshot[0] if snapshot else None,
        "snapshot_lock_only": snapshot[1] if snapshot else None,
        "vault": vault_root,
        "fingerprint": state.fingerprint if state else None,
        "venv": str(prefix),
        "torch": str(torch.__version__) if torch is not None and hasattr(torch, "__version__") else None,
        "cuda": _plain(getattr(version, "cuda", None)),
        "python": _python_version(),
        "executable": sys.executable,
        "host": socket.gethostname(),
        "argv": [str(a) for a in sys.argv],
        "git": git_state(Path.cwd()),
        "env": relevant_env(),
        "warnings": list(warnings),
    }


def _plain(value: Any) -> str | None:
    return None if value is None else str(value)


# --- from a checkpoint back to its snapshot --------------------------------------------------------------


def snapshot_of(vault, path: Path) -> str:
    """The id of the snapshot a stamped checkpoint (file or directory) names, in ``vault``.

    A stamp that names a lock-only snapshot resolves to a full snapshot with the same fingerprint when the
    vault holds one (same distributions, files stored: restores without rebuilding wheels). A stamp without
    a snapshot (the vault could not be written at save time) resolves through its fingerprint. Raises
    :class:`NotFoundError` with one line naming the id and the vault searched.
    """
    from envvault.torch.directories import read_checkpoint

    info = read_checkpoint(path)
    stamp = info.stamp
    if not stamp:
        raise NotFoundError(f"{path} carries no envvault stamp (saved without stamping); name a snapshot instead")
    sid, fp = stamp.get("snapshot"), stamp.get("fingerprint")
    if sid is not None and not (isinstance(sid, str) and len(sid) == 64 and all(c in "0123456789abcdef" for c in sid)):
        raise UsageError(f"{path}: its stamp's snapshot {str(sid)[:80]!r} is not a snapshot id")
    fp = fp if isinstance(fp, str) else None
    venv = stamp.get("venv") if isinstance(stamp.get("venv"), str) else None
    better = find_snapshot(vault, fp, venv) if fp else None
    if sid is None:
        if better:
            return better[0]
        raise NotFoundError(f"{path}: its stamp names no snapshot (the vault was not writable when it was saved) "
                            f"and {vault.root} holds none with fingerprint {fp or 'unknown'}")
    if sid in set(vault.snapshot_ids()):
        # A lock-only snapshot stores no files: a full one of the same environment (same lock-level
        # fingerprint and venv: the detached snap of the first stamp, or any later one) restores better.
        if better and not better[1] and better[0] != sid and vault.load_snapshot(sid).doc.get("lock_only"):
            return better[0]
        return sid
    where = stamp.get("vault")
    hint = f"; it was written to {where} (pass --vault)" if isinstance(where, str) and where != str(vault.root) else ""
    raise NotFoundError(f"snapshot {sid} named by {path.name} is not in {vault.root}{hint}")

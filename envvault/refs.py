"""What a snapshot argument of ``diff`` and ``restore`` names: an id, prefix, tag or ``latest``; a stamped
checkpoint file; or a checkpoint folder (Hugging Face ``checkpoint-N/``, a DCP folder), whose stamps must
agree on one snapshot.

Each answer carries the environment it belongs to (``venv``): the stamp's for a checkpoint, else the
snapshot's own, so that ``current`` and ``restore`` can default to it.
"""

from __future__ import annotations

from envvault.model.records import dataclass
from pathlib import Path

from envvault.errors import AmbiguousError, NotFoundError, RefusedError, UsageError
from envvault.model.stamp import SIDECAR_NAME, Stamp

__all__ = ["Ref", "resolve_arg", "resolve_name", "resolve_named", "is_lockfile", "environment_snapshot",
           "stamped_parts"]


@dataclass(frozen=True)
class Ref:
    """A resolved snapshot argument: the snapshot id, a label for output, and the environment it names."""

    sid: str
    label: str
    venv: str | None
    scoped: bool = False  # ``latest`` taken for ``venv`` (the environment in scope): restore acts on that one


def is_lockfile(path: Path) -> bool:
    return path.suffix == ".toml" or path.name.startswith("pylock")


def resolve_arg(vault, arg: str, venv: str | None = None) -> Ref:
    """``arg`` as a snapshot: a checkpoint file (not a lockfile), a checkpoint folder, else an id / prefix /
    tag / ``latest`` (``resolve_name``; ``venv``: the command's ``--venv``). A folder that holds no checkpoint
    is taken as a name when the vault knows one."""
    path = Path(arg).expanduser()
    if path.is_file() and not is_lockfile(path):
        return _checkpoint_file(vault, path)
    if path.is_dir():
        if _holds_checkpoints(path):
            return _checkpoint_folder(vault, path)
        try:
            return resolve_named(vault, arg, venv)
        except NotFoundError:
            raise NotFoundError(f"{path} is a folder without checkpoint files (.metadata, envvault.json, "
                                f"*.safetensors, *.bin, *.pt, ...) and no snapshot or tag has that name") from None
    return resolve_named(vault, arg, venv)


def resolve_named(vault, arg: str, venv: str | None = None) -> Ref:
    """``arg`` as an id, prefix, tag or ``latest`` (``resolve_name``), with the environment it names: for
    ``latest``, the environment it was taken for (``scoped``), else the snapshot's own."""
    sid, scope = _resolve(vault, arg, venv)
    snap = environment_snapshot(vault, sid, arg)  # a cache-only one refused
    # `latest` of the environment in scope, whichever environment's snapshot it is
    return Ref(sid, sid[:12], str(scope), scoped=True) if scope is not None else Ref(sid, sid[:12], snap.venv)


def resolve_name(vault, ref: str, venv: str | None = None) -> str:
    """The id ``ref`` names: an id, prefix or tag (``Vault.resolve``), or ``latest`` as a command means it.
    With an environment in scope (``venv``: the command's ``--venv``; ``--python``; else the active venv, or
    the active conda environment when it is one envvault takes), ``latest`` is the snapshot that environment
    was last snapped as or restored to (``baseline_snapshot``, what ``status`` compares with: never a restore's
    backup, nor the "after" snapshot of a guard that rolled back), else the newest snapshot of that path; an
    environment without one is a ``NotFoundError``, never another environment's snapshot. Without one, the
    environment of the vault's newest environment snapshot is in scope (since deleted or not)."""
    return _resolve(vault, ref, venv)[0]


def _resolve(vault, ref: str, venv: str | None) -> tuple[str, Path | None]:
    """``resolve_name``'s id, and the environment ``latest`` was taken for (None: another name, or the
    vault's newest snapshot as it is, when its environment cannot be named)."""
    if ref.strip() != "latest":
        return vault.resolve(ref), None
    import os

    from envvault.env.probe import chosen_python, find_target
    from envvault.errors import EnvvaultError
    from envvault.model.paths import absolute_path

    if venv is not None or chosen_python():
        try:
            scope = find_target(venv)
        except UsageError:
            if venv is None or not _missing(absolute_path(venv)):
                raise  # --python, a --venv there that envvault cannot take, or no path at all: what snap would say
            scope = absolute_path(venv)  # a --venv deleted since (to be rebuilt with --into), as an active one
        return _latest_of(vault, scope), scope
    active = os.environ.get("VIRTUAL_ENV")
    conda = os.environ.get("CONDA_PREFIX")
    if active or conda:
        try:
            scope = find_target(None)
        except UsageError:
            if not active:  # a conda environment envvault does not take (a base every shell activates), or
                scope = None  # one removed while active: none in scope
            else:
                scope = absolute_path(active)
                if os.path.lexists(scope):
                    raise  # an active venv envvault cannot take: what snap would say
                # else an active venv since deleted (to be rebuilt with --into): what the vault has of it
        if scope is not None:
            return _latest_of(vault, scope), scope
    sid = vault.resolve("latest")
    recorded = vault.load_snapshot(sid).snapshot.venv
    if recorded:
        try:  # its environment's latest (a restore since, a guard's rollback), there or since deleted
            scope = find_target(recorded) if Path(recorded).is_dir() else Path(recorded)
            return _latest_of(vault, scope), scope
        except EnvvaultError:
            pass  # a root another interpreter owns, a folder that is no environment now: the snapshot itself
    return sid, None


def _missing(path: Path) -> bool:
    """Whether nothing is at ``path`` (a folder deleted since), as against a path no folder can have (a name
    too long, a file on its way: helper 29's 300-character name failed as "cannot write", exit 6)."""
    import os

    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def _latest_of(vault, target: Path) -> str:
    from envvault.env.probe import system_of
    from envvault.restore.baseline import baseline_snapshot

    try:
        return baseline_snapshot(vault, target)
    except NotFoundError:
        if system_of(target) is not None:  # a system root: another interpreter's snapshots of it are not its
            raise
        # A venv with snapshots of that path by another interpreter only (rebuilt with another Python: the
        # restore then says so), or none (named in the error).
        try:
            return vault.resolve("latest", venv=str(target))
        except NotFoundError:
            if target.is_dir():
                raise  # its hint snaps it
            raise NotFoundError(f"no snapshot of {target} in {vault.location}, and {target} does not exist; pass "
                                f"--venv with an environment the vault has (`{vault.command('list')}`)") from None


def environment_snapshot(vault, sid: str, arg: str):
    """The snapshot ``sid`` (named ``arg``) for a command that needs an environment (restore, diff, export,
    status --against); a cache-only snapshot is refused (``RefusedError``, exit 3, as a restore refused it
    before) with one line that names the cache command to use."""
    snap = vault.load_snapshot(sid).snapshot
    if snap.is_cache_only:
        named = sid[:12] if sid.startswith(arg.strip().lower()) else f"{sid[:12]} ({arg})"
        raise RefusedError(f"snapshot {named} is cache-only (made by `envvault cache snap`): it holds compile "
                           f"caches, no environment; use `{vault.command('cache', 'restore', sid[:12])}`, or "
                           f"`{vault.command('cache', 'diff', sid[:12])} OTHER` to compare it")
    return snap


def _checkpoint_file(vault, path: Path) -> Ref:
    from envvault.torch.directories import read_checkpoint
    from envvault.torch.resolve import snapshot_of

    sid = snapshot_of(vault, path)
    stamp = read_checkpoint(path).stamp
    return Ref(sid, f"{path.name} ({sid[:12]})", _venv_of(vault, sid, stamp, str(path)))


def _venv_of(vault, sid: str, stamp: Stamp | None, arg: str) -> str | None:
    snap = environment_snapshot(vault, sid, arg)  # a stamp that names a cache-only snapshot is refused too
    return stamp.venv if stamp is not None and stamp.venv else snap.venv


# -- folders -----------------------------------------------------------------------------------------


def _holds_checkpoints(d: Path) -> bool:
    """A checkpoint folder: a DCP folder (``.metadata``), a stamp sidecar, checkpoint files, or a sub-folder
    that is a DCP folder or has a sidecar (Hugging Face with FSDP writes ``pytorch_model_fsdp_0/``)."""
    from envvault.torch.checkpoint import CHECKPOINT_SUFFIXES

    try:
        entries = list(d.iterdir())
    except OSError:
        return False
    for e in entries:
        if e.name in (".metadata", SIDECAR_NAME) or (e.suffix in CHECKPOINT_SUFFIXES and e.is_file()):
            return True
    return bool(_sub_checkpoints(d, entries))


def _sub_checkpoints(d: Path, entries: list[Path] | None = None) -> list[Path]:
    entries = sorted(d.iterdir()) if entries is None else sorted(entries)
    return [e for e in entries if e.is_dir() and ((e / ".metadata").is_file() or (e / SIDECAR_NAME).is_file())]


def stamped_parts(d: Path) -> list[tuple[str, Path, Stamp]]:
    """``(name shown, path to resolve, stamp)`` for every stamped part of folder ``d``: its sidecar or each
    stamped checkpoint file in it, then the same for each checkpoint sub-folder. Read with the folder
    readers of :mod:`envvault.torch.directories` (through ``read_checkpoint``)."""
    from envvault.torch.directories import read_checkpoint

    parts: list[tuple[str, Path, Stamp]] = []
    for folder, prefix in [(d, "")] + [(s, s.name + "/") for s in _sub_checkpoints(d)]:
        if folder is d and not _has_own_checkpoint(d):
            continue
        info = read_checkpoint(folder)
        if info.stamp is not None and info.stamp_source == SIDECAR_NAME:
            parts.append((prefix + SIDECAR_NAME, folder, info.stamp))
        for f in info.files:
            if f.stamp is not None:
                parts.append((prefix + f.name, folder / f.name, f.stamp))
    return parts


def _has_own_checkpoint(d: Path) -> bool:
    from envvault.torch.checkpoint import CHECKPOINT_SUFFIXES

    return any(e.name in (".metadata", SIDECAR_NAME) or (e.suffix in CHECKPOINT_SUFFIXES and e.is_file())
               for e in d.iterdir())


def _checkpoint_folder(vault, d: Path) -> Ref:
    """The one snapshot the stamps in folder ``d`` name. Files stamped alike are resolved once; when they
    resolve to different snapshots, one line names the files and the snapshot each names (exit 4)."""
    from envvault.torch.resolve import snapshot_of

    parts = stamped_parts(d)
    if not parts:
        raise NotFoundError(f"{d}: no file in this checkpoint folder carries an envvault stamp (saved without "
                            "stamping); name a snapshot instead")
    groups: dict[str, list[tuple[str, Stamp]]] = {}
    resolved: dict[tuple, str] = {}
    for name, path, stamp in parts:
        key = (stamp.snapshot, stamp.fingerprint, stamp.venv, stamp.snapshot_lock_only, stamp.vault)
        if key not in resolved:
            resolved[key] = snapshot_of(vault, path)
        groups.setdefault(resolved[key], []).append((name, stamp))
    if len(groups) > 1:
        listed = "; ".join(f"{', '.join(n for n, _ in members)} -> {sid[:12]}" for sid, members in groups.items())
        raise AmbiguousError(f"{d}: its files are stamped with different snapshots ({listed}); name one file "
                             "or a snapshot id")
    (sid, members), = groups.items()
    label = f"{d.name}/ ({sid[:12]})"
    return Ref(sid, label, _venv_of(vault, sid, members[0][1], str(d)))

"""The verdict of the last ``status`` that found an environment equal to its snapshot, and the quick
``status`` that answers from it (docs/format.md, "Status verdicts": ``state/verdict-<key>.json``).

A ``status`` that finds nothing changed (and a snap, or a restore, in place or ``--into``, whose verify scan
found the environment equal to the snapshot, once that snapshot is its baseline) writes what its answer rested on: the snapshot and
the note printed with it, the dist-info folders its scan listed (in order), the stat cache's groups file its
scan used (``StatCache.identity``: the one it loaded unchanged, or the one it saved), and the vault's side
(``vault_stamp``: the stat keys of ``snapshots/`` and of the environment's ``restored-`` marker, taken before
the baseline was chosen, and of the snapshot's file).

The next ``status`` answers "unchanged" from the verdict alone (``unchanged_since``) when the vault's side
is the same, the groups file is still that one (read, and checked to be the file that was read), the
environment lists the same dist-info folders, every one of their groups is still fresh (the scan's own rule,
``fresh.py``: one ``lstat`` a file) and the interpreter still answers from the memo
(``VenvReader.memoised_interpreter``: nothing is probed): then the full command would scan the same groups
into the same packages against the same snapshot. It imports neither the CLI, nor the model, the diff or the
ingester. Anything else (another snapshot, a restore, an interrupted restore, a changed file, a new or
removed distribution, a verdict that does not parse) sends the command down its full path, which writes a
new verdict when it finds nothing changed. Writing one costs the full command a small file: the groups file
is not rewritten for it.

A verdict in a vault copied from someone else is no more trusted than the stat cache beside it: it answers
only when every file of the environment has the size, mtime, inode and ctime recorded there, which no one
can know of another machine's files. Someone who can write this machine's ``state/`` can make a verdict name
the groups file there now (its size, mtime and inode are theirs to read), as they can rewrite the stat cache
itself: state/ is trusted as the vault's own folders are, against a copy, not against its own machine's
users (docs/format.md, "Threat model").
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    from envvault.runtime_types import NamedTuple

from envvault.errors import CorruptError, EnvvaultError
from envvault.model.encoding import json_loads
from envvault.vault.fsutil import read_regular
from envvault.vault.statcache import StatCache, stat_key

from .fresh import base_of, entry_key, env_cache_name, fresh_groups, journal_left

__all__ = ["Verdict", "parse_verdict", "verdict_name", "restored_name", "vault_stamp", "verdict_stamp",
           "snapshots_dir", "snapshot_stamp", "record_verdict", "unchanged_since", "unchanged_text"]

_ID = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # a note is printed as it is: no escape sequence, no new line
VERSION = 1
# A verdict lists one path a distribution: 10,000 of them are well under 4 MiB; parsed, the largest file
# takes at most about 60 MB (a list of one-letter strings), read from a vault that may be someone else's.
_LIMIT = 4 << 20


class Verdict(NamedTuple):
    """``state/verdict-<key>.json``, parsed (``parse_verdict``)."""

    venv: str  # the environment's path as the command named it
    snapshot: str  # the id of the snapshot it matched
    note: str  # what the command printed after the id ("" for none)
    vault: tuple[int, ...]  # vault_stamp before the baseline was chosen
    snapshot_stat: tuple[int, ...]  # snapshot_stamp of that snapshot's file
    entries: tuple[str, ...]  # the dist-info folders the scan listed, as keys of the stat cache's groups
    groups: tuple[int, ...]  # the stat cache's groups file the scan used (``StatCache.identity``)


def _ints(value, what: str, problems: list[str]) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        problems.append(f"{what}: not a list of integers")
        return ()
    return tuple(value)


def parse_verdict(doc) -> tuple[Verdict | None, list[str]]:
    """A verdict from its file's JSON and the problems found (each with its field); ``(None, problems)``
    when there are any. A verdict that does not parse is simply not used."""
    if not isinstance(doc, dict):
        return None, ["verdict: not an object"]
    problems: list[str] = []
    if doc.get("version") != VERSION:
        problems.append(f"verdict.version: not {VERSION}")
    venv, sid, note = doc.get("venv"), doc.get("snapshot"), doc.get("note")
    if not isinstance(venv, str) or not venv:
        problems.append("verdict.venv: not a path")
    if not isinstance(sid, str) or not _ID.fullmatch(sid):
        problems.append("verdict.snapshot: not a snapshot id")
    if not isinstance(note, str) or len(note) > 4096 or _CONTROL.search(note):
        problems.append("verdict.note: not a text of at most 4096 characters, none a control character")
    vault = _ints(doc.get("vault"), "verdict.vault", problems)
    snap = _ints(doc.get("snapshot_stat"), "verdict.snapshot_stat", problems)
    groups = _ints(doc.get("groups"), "verdict.groups", problems)
    if len(groups) != 3:
        problems.append("verdict.groups: not a size, an mtime and an inode")
    entries = doc.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, str) and e for e in entries):
        problems.append("verdict.entries: not a list of paths")
        entries = []
    unknown = sorted(set(doc) - set(Verdict._fields) - {"version"})
    if unknown:
        problems.append(f"verdict: unknown fields {', '.join(map(str, unknown))}")
    if problems:
        return None, problems
    return Verdict(venv, sid, note, vault, snap, tuple(entries), groups), []


def verdict_name(target: str | os.PathLike) -> str:
    """The state file holding the verdict of the environment at ``target``."""
    from envvault.safepaths import env_key

    return f"verdict-{env_key(target)}.json"


def restored_name(target: str | os.PathLike, interpreter: str | None = None) -> str:
    """The state file naming the snapshot last restored onto ``target`` (``restore/baseline.py``); with
    ``interpreter``, a system environment's: the one of that interpreter (several may share a root)."""
    from envvault.safepaths import environment_key

    return f"{_RESTORED}{environment_key(target, interpreter)}.json"


_RESTORED = "restored-"


def is_restored_name(name: str) -> bool:
    """Whether the state file ``name`` is one ``restored_name`` gives."""
    return name.startswith(_RESTORED) and name.endswith(".json")


UNDONE = "undone.json"  # the snapshots a guard rolled back (its "after" ones): states a restore undid
_UNDONE_KEPT = 1000


def undone_snapshots(vault) -> frozenset[str]:
    """The ids of the "after" snapshots guard rolled back on this machine (``record_undone``): like a
    restore's backups, states a restore undid (never a lock-only snapshot's stand-in for its contents). A
    damaged or missing file counts as none (a cache)."""
    import json

    data = vault.state.read(UNDONE, 1 << 20)
    try:
        ids = json.loads(data)["snapshots"] if data else []
    except (ValueError, KeyError, TypeError):
        return frozenset()
    return frozenset(i for i in ids if isinstance(i, str)) if isinstance(ids, list) else frozenset()


def record_undone(vault, sid: str) -> None:
    """Add ``sid`` to ``undone_snapshots`` (the newest ``_UNDONE_KEPT``). Never fails the caller."""
    import json

    from envvault.errors import EnvvaultError

    try:
        data = vault.state.read(UNDONE, 1 << 20)
        ids = json.loads(data)["snapshots"] if data else []
        ids = [i for i in ids if isinstance(i, str) and i != sid] if isinstance(ids, list) else []
    except (ValueError, KeyError, TypeError):
        ids = []
    try:
        vault.state.write(UNDONE, json.dumps({"snapshots": (ids + [sid])[-_UNDONE_KEPT:]}).encode(), durable=False)
    except EnvvaultError:
        pass


def _stat_key_or_absent(path: Path) -> list[int]:
    """The ``lstat`` key of ``path``, or ``[-1]`` when there is nothing there."""
    try:
        return stat_key(os.lstat(path))
    except FileNotFoundError:
        return [-1]


def vault_stamp(snapshots_dir: Path, state_dir: Path, target: str | os.PathLike) -> tuple[int, ...]:
    """What the baseline of ``target`` depends on in a local vault: the stat keys of its ``snapshots/``
    folder (any snapshot added or removed changes it) and of the environment's ``restored-`` marker
    (``[-1]`` when there is none). ``lstat``: a folder replaced by a link does not match."""
    return tuple(_stat_key_or_absent(snapshots_dir) + _stat_key_or_absent(state_dir / restored_name(target)))


def verdict_stamp(vault, target: Path) -> tuple[int, ...] | None:
    """``vault_stamp`` of an open vault (``store.Vault``), None for a vault in a bucket: its snapshots are
    not a folder whose stat tells a change."""
    from envvault.vault.local import LocalBackend

    if type(vault.backend) is not LocalBackend:
        return None
    return vault_stamp(snapshots_dir(vault.backend.root), vault.state.dir, target)


def snapshots_dir(root: Path) -> Path:
    """The folder of a local vault's snapshot files (docs/format.md, "Directory tree")."""
    return Path(root) / "snapshots"


def snapshot_stamp(snapshot_file: Path) -> tuple[int, ...]:
    """The stat key of a snapshot's file (a document rewritten in place does not match)."""
    return tuple(_stat_key_or_absent(snapshot_file))


def record_verdict(vault, cache: StatCache, *, target: Path, sid: str, note: str | None,
                   stamp: tuple[int, ...]) -> None:
    """Write the verdict that the environment at ``target`` matched snapshot ``sid`` (of the open local
    ``vault``) when ``cache``'s last scan (``cache.listed``) was made, the vault's side being ``stamp``
    (``verdict_stamp``) before the baseline was chosen. Call it once ``cache`` is saved: nothing is written
    when its groups are not those of a file on disk (``identity``) or no scan listed them. Never fails."""
    groups = cache.identity()
    if groups is None or cache.listed is None:
        return
    doc = {"version": VERSION, "venv": str(target), "snapshot": sid, "note": note or "", "vault": list(stamp),
           "snapshot_stat": list(snapshot_stamp(vault.backend.path("snapshots", sid))),
           "entries": list(cache.listed), "groups": list(groups)}
    try:
        vault.state.write(verdict_name(target), json.dumps(doc, separators=(",", ":")).encode(), durable=False)
    except (OSError, EnvvaultError):
        pass  # a cache: the next status answers in full


def unchanged_since(root: Path, venv: str | None) -> tuple[Path, Verdict] | None:
    """``(target, verdict)`` when the environment ``venv`` (or the active one) is unchanged since the
    snapshot its last full ``status`` found it equal to, by the rules of the module docstring; None when that
    cannot be told without the full command (which then answers, errors included)."""
    from envvault.env.probe import find_target, system_of
    from envvault.env.venv import VenvReader
    from envvault.vault.config import open_local
    from envvault.vault.local import LocalBackend
    from envvault.vault.state import LocalState

    try:
        target = find_target(venv)
    except EnvvaultError:
        return None
    if system_of(target) is not None or not (target / "pyvenv.cfg").is_file():
        return None  # a system environment: its baseline depends on the interpreter in use
    backend, state = LocalBackend(root), LocalState.in_vault(root)
    try:
        open_local(backend)  # what opening the vault checks: one the full command refuses answers nothing here
    except (EnvvaultError, OSError):
        return None
    if journal_left(target, state.dir):
        return None  # an interrupted restore: the full command settles it
    try:
        verdict, _ = parse_verdict(json_loads(read_regular(state.dir / verdict_name(target), _LIMIT, "verdict")))
    except (OSError, ValueError, CorruptError):
        return None
    if verdict is None or verdict.venv != str(target):
        return None
    if vault_stamp(snapshots_dir(root), state.dir, target) != verdict.vault or verdict.snapshot_stat == (-1,) \
            or snapshot_stamp(backend.path("snapshots", verdict.snapshot)) != verdict.snapshot_stat:
        return None
    cache = StatCache(state.dir / env_cache_name(target), tmp_dir=state.tmp_dir)
    if cache.identity() != verdict.groups:  # not the groups file the verdict rested on
        return None
    try:
        reader = VenvReader(target, cache)
        if reader.memoised_interpreter() is None:  # the interpreter or pyvenv.cfg changed: nothing is probed
            return None
        base = base_of(target)
        entries = []
        for dist_info, site in reader.dist_entries():
            rel = entry_key(dist_info, target, base)
            group = cache.groups.get(rel)
            if not group or not (group.get("manifest_check") or group.get("manifest_full")):
                return None
            entries.append((dist_info, site, group, True))  # (as the scan's: True, a manifest id is there)
            if len(entries) > len(verdict.entries) or rel != verdict.entries[len(entries) - 1]:
                return None
    except (EnvvaultError, OSError, ValueError):
        return None
    if len(entries) != len(verdict.entries) or len(fresh_groups(entries, target)) != len(entries):
        return None
    return target, verdict


def unchanged_text(target: str | os.PathLike, sid: str, note: str | None, colour: bool | None = None) -> str:
    """What ``status`` prints for an unchanged environment (the full command and the quick one); ``colour``:
    style the id or not (None: ``output.use_colour``)."""
    from envvault.output import style

    return f"{target}: unchanged since snapshot {style(sid[:12], 'yellow', colour)}" + (f" ({note})" if note else "")

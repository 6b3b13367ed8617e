"""The restore journal (docs/format.md, "Restoring an environment (in place)", step 3): the record of a
restore under way, written to ``<venv>/.envvault-restore.json`` before anything is staged and deleted when
the restore is verified. ``parse_journal`` validates one read back (it lies in the environment, so it may be
damaged) and lists every problem with its place; ``to_dict`` writes the canonical form (the keys in the
order the format lists them). ``Journal.salvage`` is what a rerun can still use from a damaged one. Pure.
"""

from __future__ import annotations

from envvault.model.records import dataclass
from typing import Any, Mapping

from envvault.errors import CorruptError

__all__ = ["FORMAT", "Journal", "parse_journal"]

FORMAT = 1
_LISTS = ("staging_dirs", "removals", "writes", "dist_infos", "protected")
_MAX_PROBLEMS = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class Journal:
    """Paths are relative to the environment (``""`` or ``"."`` is the environment itself)."""

    snapshot: str | None  # the snapshot being restored (None: unknown, from a damaged journal)
    backup: str | None = None  # the backup snapshot this restore took
    pid: int | None = None
    started: str | None = None  # UTC, ``YYYY-MM-DDTHH:MM:SSZ``
    staging_dirs: tuple[str, ...] = ()  # folders holding staged temp files
    removals: tuple[str, ...] = ()  # files to delete
    writes: tuple[str, ...] = ()  # files to write
    dist_infos: tuple[str, ...] = ()  # dist-info folders being written
    protected: tuple[str, ...] = ()  # folders never pruned
    format: int = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format, "snapshot": self.snapshot, "backup": self.backup, "pid": self.pid,
            "started": self.started, "staging_dirs": list(self.staging_dirs), "removals": list(self.removals),
            "writes": list(self.writes), "dist_infos": list(self.dist_infos), "protected": list(self.protected),
        }  # fmt: skip

    @classmethod
    def salvage(cls, obj: object) -> "Journal":
        """What a rerun can still use from a journal that does not parse: each field that has the right
        type, the strings of each list; nothing at all from one that is not a JSON object."""
        if not isinstance(obj, Mapping):
            return cls(snapshot=None)
        lists = {k: tuple(x for x in obj.get(k) if isinstance(x, str)) if isinstance(obj.get(k), list) else ()
                 for k in _LISTS}
        return cls(snapshot=_str(obj.get("snapshot")), backup=_str(obj.get("backup")), pid=_int(obj.get("pid")),
                   started=_str(obj.get("started")), **lists)


def parse_journal(obj: object, where: str = "the restore journal") -> Journal:
    """The journal in ``obj`` (parsed JSON); ``CorruptError`` naming every problem with its place
    (``removals[3]: expected a string``). Keys it does not know are ignored."""
    if not isinstance(obj, Mapping):
        raise CorruptError(f"{where} is not a JSON object")
    problems: list[str] = []
    fmt = obj.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        problems.append("format: expected an integer")
    elif fmt > FORMAT:
        problems.append(f"format: {fmt} is newer than this envvault reads ({FORMAT})")
    for key in ("snapshot", "backup", "started"):
        if obj.get(key) is not None and not isinstance(obj.get(key), str):
            problems.append(f"{key}: expected a string or null")
    pid = obj.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        problems.append("pid: expected an integer or null")
    for key in _LISTS:
        value = obj.get(key, [])
        if not isinstance(value, list):
            problems.append(f"{key}: expected a list")
            continue
        problems += [f"{key}[{i}]: expected a string without NUL" for i, x in enumerate(value)
                     if not isinstance(x, str) or "\x00" in x]
    if problems:
        more = f"; and {len(problems) - _MAX_PROBLEMS} more" if len(problems) > _MAX_PROBLEMS else ""
        raise CorruptError(f"{where}: " + "; ".join(problems[:_MAX_PROBLEMS]) + more)
    return Journal(snapshot=obj.get("snapshot"), backup=obj.get("backup"), pid=pid, started=obj.get("started"),
                   format=fmt, **{k: tuple(obj.get(k, [])) for k in _LISTS})


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None

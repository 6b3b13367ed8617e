"""Snapshot heads (docs/format.md, "Snapshot heads"): the few fields ``list`` shows of a snapshot, computed
once from a document that parsed and kept beside the documents (a node's ``state/``, a bucket's ``heads/``)
so that listing 1,000 snapshots parses none of them. Pure: no I/O."""

from __future__ import annotations

from envvault.model.records import dataclass
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any

from envvault.model._fields import (
    NO_EXTRA, Key, check_bool, check_int, check_opt_int, check_opt_str, check_str, dump_fields, load_record,
    raise_problems,
)
from envvault.model.snapshot import Snapshot

__all__ = ["SnapshotHead", "head_of", "parse_head", "torch_label"]

_EMPTY: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotHead:
    """What ``list`` shows of one snapshot, and what choosing one needs (``kind``; a system environment's
    ``interpreter``, ``system``). ``python``: its version (None for a cache-only snapshot); ``packages``,
    ``caches``: how many; ``torch``: the label ``torch_label`` gives, or None."""

    created: str
    message: str = ""
    trigger: str | None = None
    venv: str | None = None
    python: str | None = None
    packages: int = 0
    torch: str | None = None
    lock_only: bool = False
    new_bytes: int | None = None
    caches: int = 0
    kind: str = "snapshot"
    interpreter: str | None = None
    system: bool = False
    extra: Any = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = (Key("created", check_str, True, ""), Key("message", check_str, True, ""),
            Key("trigger", check_opt_str, True), Key("venv", check_opt_str, True),
            Key("python", check_opt_str, True), Key("packages", check_int, True, 0),
            Key("torch", check_opt_str, True), Key("lock_only", check_bool, True, False),
            Key("new_bytes", check_opt_int, True), Key("caches", check_int, True, 0),
            # added for status and `latest` (heads saved before lack them: a choice checks its document)
            Key("kind", check_str, False, "snapshot"), Key("interpreter", check_opt_str),
            Key("system", check_bool, False, False))

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, SnapshotHead.KEYS)


def torch_label(snap: Snapshot) -> str:
    """``2.5.1+cu124 (2.5.1) cuda 12.4``: torch's version, the version its build reports when that differs,
    and its CUDA; "" without torch."""
    p = snap.package("torch")
    if p is None:
        return ""
    info = p.build_info or {}
    label = p.version
    if info.get("version") and info["version"] != p.version:
        label += f" ({info['version']})"
    if info.get("cuda"):
        label += f" cuda {info['cuda']}"
    return label


def head_of(snap: Snapshot) -> SnapshotHead:
    """The head of a parsed snapshot."""
    stats = snap.stats
    return SnapshotHead(
        created=snap.created,
        message=snap.message,
        trigger=snap.trigger,
        venv=snap.venv,
        python=snap.python.version,
        packages=len(snap.packages),
        torch=torch_label(snap) or None,
        lock_only=snap.lock_only,
        new_bytes=stats.new_bytes if stats is not None and "new_bytes" not in stats.absent else None,
        caches=len(snap.caches or ()),
        kind=snap.kind,
        interpreter=snap.python.interpreter,
        system=snap.python.system,
    )


def parse_head(obj: Any, where: str = "snapshot head") -> SnapshotHead:
    """A head read back (a node's ``state/snapshot-heads.json``, a bucket's ``heads/``); CorruptError naming
    every problem."""
    if not isinstance(obj, dict):
        raise_problems(where, ["expected an object"])
    problems: list[str] = []
    head = load_record(SnapshotHead, obj, "", problems)
    raise_problems(where, problems)
    return head

"""A guard snapshot's ``provenance`` (docs/format.md, "Snapshots", added by guard) as typed records.

``provenance`` maps a normalised distribution name to where its wheel came from, as pip's ``--report``
said: ``{"url", "sha256", "index", "version", "build_id"}`` (``index``: the configured index that served it,
null for direct URLs and find-links; ``build_id``: the installed build the entry is true of). One record,
:class:`ProvenanceEntry`; one validating parser, :func:`parse_provenance` (every problem with its place,
``provenance.torch.sha256: expected a string``); ``to_dict`` writes the canonical form back (unknown keys
kept). Pure: no I/O.
"""

from __future__ import annotations

from envvault.model.records import dataclass
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Mapping

from envvault.model._fields import (
    NO_EXTRA, Key, check_dict, check_opt_str, check_str, dump_fields, load_record, raise_problems,
)

__all__ = ["ProvenanceEntry", "parse_provenance", "load_provenance", "provenance_dict"]

_EMPTY: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class ProvenanceEntry:
    """Where one installed wheel came from; true only of the build ``build_id`` (None until guard has seen
    the build pip installed)."""

    url: str = ""
    sha256: str = ""
    index: str | None = None
    version: str = ""
    build_id: str | None = None
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = (Key("url", check_str, True, ""), Key("sha256", check_str, True, ""), Key("index", check_opt_str),
            Key("version", check_str, True, ""), Key("build_id", check_opt_str))

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, self.KEYS)


def load_provenance(obj: Any, where: str, problems: list[str]) -> dict[str, ProvenanceEntry] | None:
    """The entries of a ``provenance`` object (None stays None); problems placed under ``where``
    (``provenance``) are appended. A ``Key.load`` of the snapshot's table."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        problems.append(f"{where}: expected an object or null")
        return None
    out: dict[str, ProvenanceEntry] = {}
    for name, entry in obj.items():
        at = f"{where}.{name}"
        why = check_dict(entry)
        if why:
            problems.append(f"{at}: {why}")
            continue
        out[name] = load_record(ProvenanceEntry, entry, at + ".", problems)
    return out


def parse_provenance(obj: Any, where: str = "provenance") -> dict[str, ProvenanceEntry]:
    """The one validating parser: a CorruptError listing every problem, else ``{name: ProvenanceEntry}``
    (``{}`` for null)."""
    problems: list[str] = []
    out = load_provenance(obj, where, problems)
    raise_problems(where, problems)
    return out or {}


def provenance_dict(entries: Mapping[str, ProvenanceEntry]) -> dict[str, dict]:
    """The document form of ``entries`` (what a snapshot's ``provenance`` holds)."""
    return {name: entry.to_dict() for name, entry in entries.items()}

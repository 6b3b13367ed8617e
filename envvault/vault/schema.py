"""The shape of a snapshot document (docs/format.md, "Snapshots"), checked once when it is loaded.

``snapshot_problems(doc)`` lists every problem with its place (``packages[3].build_id: expected a 64-hex
string``), so that code reading a loaded snapshot can index it without guarding every key. Keys the
readers use are checked; unknown keys are ignored (a document of a known format may carry more). Keys that
older snapshots lack (``identity``, ``scripts``, ``exec``...) may be absent.
"""

from __future__ import annotations

import re
from typing import Any, Callable

__all__ = ["snapshot_problems", "is_id", "tag_name_problem"]

_ID = re.compile(r"[0-9a-f]{64}")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HEXISH = re.compile(r"[0-9a-fA-F]+")


def is_id(value: Any) -> bool:
    """A full object or snapshot id: 64 lowercase hex digits."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def tag_name_problem(name: str) -> str | None:
    """Why ``name`` is not a tag name (docs/format.md, "Ids on the command line"), or None when it is one."""
    if not isinstance(name, str) or _TAG.fullmatch(name) is None:
        return "use 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit"
    if name == "latest":
        return "'latest' names the newest snapshot"
    if _HEXISH.fullmatch(name):
        return "a name of hex digits only would read as an id prefix"
    return None


# -- checkers: each returns None when the value fits, else what was expected ---------------------------------


def _str(v: Any) -> str | None:
    return None if isinstance(v, str) else "expected a string"


def _opt_str(v: Any) -> str | None:
    return None if v is None or isinstance(v, str) else "expected a string or null"


def _int(v: Any) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) else "expected an integer"


def _num(v: Any) -> str | None:
    return None if isinstance(v, (int, float)) and not isinstance(v, bool) else "expected a number"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "expected true or false"


def _hex_id(v: Any) -> str | None:
    return None if is_id(v) else "expected a 64-hex string"


def _opt_hex_id(v: Any) -> str | None:
    return None if v is None or is_id(v) else "expected a 64-hex string or null"


def _dict(v: Any) -> str | None:
    return None if isinstance(v, dict) else "expected an object"


def _opt_dict(v: Any) -> str | None:
    return None if v is None or isinstance(v, dict) else "expected an object or null"


def _str_list(v: Any) -> str | None:
    return None if isinstance(v, list) and all(isinstance(x, str) for x in v) else "expected a list of strings"


def _opt_str_list(v: Any) -> str | None:
    return None if v is None else _str_list(v)


def _str_map(v: Any) -> str | None:
    ok = isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
    return None if ok else "expected an object of strings"


Rule = Callable[[Any], "str | None"]

# key: (checker, required)
_TOP: dict[str, tuple[Rule, bool]] = {
    "format": (_int, True), "kind": (_str, False), "created": (_str, True), "message": (_str, False),
    "trigger": (_opt_str, False), "venv": (_opt_str, True), "lock_only": (_bool, False), "python": (_dict, True),
    "host": (_dict, False), "env": (_str_map, False), "packages": (lambda v: None if isinstance(v, list) else
                                                                 "expected a list", True),
    "caches": (lambda v: None if v is None or isinstance(v, list) else "expected a list or null", False),
    "fingerprint": (_opt_str, False), "warnings": (_str_list, False), "stats": (_dict, False),
}
_PYTHON: dict[str, tuple[Rule, bool]] = {
    k: (_opt_str, False) for k in ("implementation", "version", "abi", "soabi", "platform", "executable",
                                    "platlib", "purelib", "scripts", "base_prefix")
}
_PACKAGE: dict[str, tuple[Rule, bool]] = {
    "name": (_str, True), "version": (_str, True), "build_id": (_hex_id, True), "state_id": (_hex_id, True),
    "manifest": (_hex_id, True), "identity": (_int, False), "scripts": (_opt_str, False),
    "build_info": (_opt_dict, False), "files": (_int, False), "size": (_int, False),
    "modified": (_str_list, False), "missing": (_str_list, False), "exec": (_opt_str_list, False),
    "installer": (_opt_str, False), "record": (_str, False), "requested": (_bool, False),
}
_CACHE: dict[str, tuple[Rule, bool]] = {
    "kind": (_str, False), "root": (_str, False), "manifest": (_opt_hex_id, False), "files": (_int, False),
    "bytes": (_int, False), "warnings": (_str_list, False),
}
_GPU: dict[str, tuple[Rule, bool]] = {"name": (_str, True)}
_STATS: dict[str, tuple[Rule, bool]] = {k: (_num, False) for k in ("bytes", "files", "new_bytes", "new_objects",
                                                                    "seconds")}


def _check(obj: dict, rules: dict[str, tuple[Rule, bool]], where: str, out: list[str]) -> None:
    for key, (rule, required) in rules.items():
        if key not in obj:
            if required:
                out.append(f"{where}{key}: missing")
            continue
        why = rule(obj[key])
        if why:
            out.append(f"{where}{key}: {why}")


def snapshot_problems(doc: Any) -> list[str]:
    """Every way ``doc`` differs from the snapshot shape, each with its place; empty when it fits."""
    if not isinstance(doc, dict):
        return ["expected a JSON object"]
    out: list[str] = []
    _check(doc, _TOP, "", out)
    if isinstance(doc.get("python"), dict):
        _check(doc["python"], _PYTHON, "python.", out)
    host = doc.get("host")
    gpus = host.get("gpus") if isinstance(host, dict) else None
    if gpus is not None and not isinstance(gpus, list):
        out.append("host.gpus: expected a list or null")
    for i, g in enumerate(gpus if isinstance(gpus, list) else ()):
        if not isinstance(g, dict):
            out.append(f"host.gpus[{i}]: expected an object")
        else:
            _check(g, _GPU, f"host.gpus[{i}].", out)
    if isinstance(doc.get("stats"), dict):
        _check(doc["stats"], _STATS, "stats.", out)
    for i, p in enumerate(doc.get("packages") if isinstance(doc.get("packages"), list) else ()):
        if not isinstance(p, dict):
            out.append(f"packages[{i}]: expected an object")
        else:
            _check(p, _PACKAGE, f"packages[{i}].", out)
    for i, c in enumerate(doc.get("caches") if isinstance(doc.get("caches"), list) else ()):
        if not isinstance(c, dict):
            out.append(f"caches[{i}]: expected an object")
        else:
            _check(c, _CACHE, f"caches[{i}].", out)
    return out

"""Which distributions a guarded install may not change without a yes, and how many guard snapshots to keep.

Three layers, applied in order (a later layer wins):

1. the defaults below;
2. the vault's ``settings.json``: ``{"guard": {"protect": [...], "unprotect": [...], "keep": 20}}``;
3. the environment's ``<venv>/.envvault.toml``::

       [guard]
       protect = ["vllm"]
       unprotect = ["triton"]
       keep = 50

and then ``--protect NAME`` on the command line, which always protects. Names are normalized
(``Flash_Attn`` is ``flash-attn``); ``*`` and ``?`` match as in shell patterns (``nvidia-*``).
"""

from __future__ import annotations

import fnmatch
import re
from envvault.model.records import dataclass
from pathlib import Path
from typing import Iterable

from envvault.caches.config import VENV_FILE, venv_doc
from envvault.errors import UsageError

__all__ = [
    "DEFAULT_PROTECTED",
    "DEFAULT_KEEP",
    "VENV_FILE",
    "Protection",
    "load_protection",
    "save_vault_protection",
    "save_venv_protection",
]

DEFAULT_PROTECTED = (
    "torch", "torchvision", "torchaudio", "triton", "nvidia-*", "jax", "jaxlib", "flash-attn", "xformers",
)
DEFAULT_KEEP = 20  # guard snapshots kept per environment (each guarded command makes two)
_SEP = re.compile(r"[-_.]+")


def normalize_pattern(pattern: str) -> str:
    return _SEP.sub("-", pattern.strip()).lower()


@dataclass(frozen=True, slots=True, kw_only=True)
class Protection:
    """The effective protected patterns, each with the layer that set it, and the retention count."""

    patterns: tuple[tuple[str, str], ...]  # (pattern, source: "default" | "vault" | "venv" | "command line")
    keep: int = DEFAULT_KEEP

    def match(self, name: str) -> str | None:
        """The pattern protecting ``name`` (normalized), or None."""
        name = normalize_pattern(name)
        for pattern, _ in self.patterns:
            if fnmatch.fnmatchcase(name, pattern):
                return pattern
        return None

    def to_json(self) -> dict:
        return {"protected": [{"pattern": p, "source": s} for p, s in self.patterns], "keep": self.keep}


def _names(value: object, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise UsageError(f"{where} must be a list of package names")
    return [normalize_pattern(v) for v in value]


def _keep(value: object, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise UsageError(f"{where} must be a whole number of at least 2")
    return value


def _venv_settings(venv: Path) -> dict:
    path = venv / VENV_FILE
    guard = venv_doc(venv).get("guard", {})
    if not isinstance(guard, dict):
        raise UsageError(f"{path}: [guard] must be a table")
    return guard


def load_protection(vault_settings: dict, venv: Path | None, extra: Iterable[str] = (),
                    less: Iterable[str] = ()) -> Protection:
    """The protection for ``venv``: defaults, then the vault's settings, then ``<venv>/.envvault.toml``,
    then ``less`` (``--unprotect``) and ``extra`` (``--protect``)."""
    current: dict[str, str] = {p: "default" for p in DEFAULT_PROTECTED}
    keep = DEFAULT_KEEP
    guard = vault_settings.get("guard") if isinstance(vault_settings, dict) else None
    layers = [("vault", "settings.json guard", guard if isinstance(guard, dict) else {})]
    if venv is not None:
        layers.append(("venv", str(venv / VENV_FILE), _venv_settings(venv)))
    for source, where, table in layers:
        for name in _names(table.get("unprotect"), f"{where}.unprotect"):
            current.pop(name, None)
        for name in _names(table.get("protect"), f"{where}.protect"):
            current[name] = source
        keep = _keep(table.get("keep"), f"{where}.keep") or keep
    for name in less:
        current.pop(normalize_pattern(name), None)
    for name in extra:
        current[normalize_pattern(name)] = "command line"
    return Protection(patterns=tuple(sorted(current.items())), keep=keep)


def _edit(guard: dict, protect: Iterable[str], unprotect: Iterable[str], keep: int | None) -> dict:
    guard = dict(guard)
    prot = set(_names(guard.get("protect"), "guard.protect"))
    unprot = set(_names(guard.get("unprotect"), "guard.unprotect"))
    for name in map(normalize_pattern, protect):
        prot.add(name)
        unprot.discard(name)
    for name in map(normalize_pattern, unprotect):
        unprot.add(name)
        prot.discard(name)
    guard["protect"], guard["unprotect"] = sorted(prot), sorted(unprot)
    if keep is not None:
        guard["keep"] = _keep(keep, "keep")
    return guard


def save_vault_protection(vault, *, protect: Iterable[str] = (), unprotect: Iterable[str] = (),
                          keep: int | None = None) -> dict:
    """Change the vault's ``guard`` settings (read, modify, replace by rename); returns the new table."""
    settings = vault.settings()
    settings["guard"] = _edit(settings.get("guard") or {}, protect, unprotect, keep)
    vault.save_settings(settings)
    return settings["guard"]


def save_venv_protection(venv: Path, *, protect: Iterable[str] = (), unprotect: Iterable[str] = (),
                         keep: int | None = None) -> dict:
    """Change the ``[guard]`` table of ``<venv>/.envvault.toml`` (other tables are kept; comments are not)."""
    import tomli_w

    from envvault.vault.fsutil import atomic_write

    path = venv / VENV_FILE
    doc = venv_doc(venv)
    doc["guard"] = _edit(doc.get("guard") or {}, protect, unprotect, keep)
    atomic_write(path, tomli_w.dumps(doc).encode(), mode=0o644)
    return doc["guard"]

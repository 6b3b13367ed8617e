"""Cache directories a user adds: kept in the vault's settings or in a venv's ``.envvault.toml``.

- vault: ``settings.json`` ``{"caches": {"dirs": ["/abs/path", ...]}}``, for every environment.
- venv: ``<venv>/.envvault.toml`` ``[caches] dirs = ["path", ...]``, relative paths resolved against the
  venv, for snaps of that environment only. Other tables of the file (``[guard]``) are kept.
"""

from __future__ import annotations

import os
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Iterable, Literal

from ..errors import UsageError

__all__ = ["VENV_FILE", "venv_doc", "configured_dirs", "remember_dirs", "forget_dirs"]

VENV_FILE = ".envvault.toml"  # shared with the guard's per-venv settings


def configured_dirs(vault_settings: dict, venv: Path | None) -> list[Path]:
    """The vault's cache dirs, then the venv's, absolute, without duplicates. Raises ``UsageError`` for a
    malformed setting, naming where it is."""
    found: list[Path] = []
    table = vault_settings.get("caches") if isinstance(vault_settings, dict) else None
    found += _dirs(table, "settings.json caches.dirs", None)
    if venv is not None:
        found += _dirs(_venv_table(venv), f"{venv / VENV_FILE} [caches] dirs", venv)
    out: list[Path] = []
    for p in found:
        if p not in out:
            out.append(p)
    return out


def remember_dirs(vault, dirs: Iterable[Path], *, where: Literal["vault", "venv"] = "vault",
                  venv: Path | None = None) -> list[Path]:
    """Add ``dirs`` (made absolute) to the vault's or the venv's cache dirs; returns that list."""
    return _edit(vault, [_absolute(d) for d in dirs], [], where, venv)


def forget_dirs(vault, dirs: Iterable[Path], *, where: Literal["vault", "venv"] = "vault",
                venv: Path | None = None) -> list[Path]:
    """Remove ``dirs`` from the vault's or the venv's cache dirs; returns what is left."""
    return _edit(vault, [], [_absolute(d) for d in dirs], where, venv)


def _edit(vault, add: list[Path], drop: list[Path], where: str, venv: Path | None) -> list[Path]:
    if where == "venv":
        if venv is None:
            raise UsageError("keeping cache dirs in a venv needs --venv PATH or an active virtual environment")
        doc = venv_doc(venv)
        table = doc.get("caches") if isinstance(doc.get("caches"), dict) else {}
        current = _dirs(table, f"{venv / VENV_FILE} [caches] dirs", venv)
    else:
        settings = vault.settings()
        table = settings.get("caches") if isinstance(settings.get("caches"), dict) else {}
        current = _dirs(table, "settings.json caches.dirs", None)
    new = [p for p in current if p not in drop] + [p for p in add if p not in current]
    if where == "venv":
        import tomli_w

        from ..vault.fsutil import atomic_write

        doc["caches"] = dict(table, dirs=[str(p) for p in new])
        atomic_write(venv / VENV_FILE, tomli_w.dumps(doc).encode("utf-8"), mode=0o644)
    else:
        settings["caches"] = dict(table, dirs=[str(p) for p in new])
        vault.save_settings(settings)
    return new


def _dirs(table: object, where: str, base: Path | None) -> list[Path]:
    if not isinstance(table, dict) or "dirs" not in table:
        return []
    value = table["dirs"]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"{where} must be a list of paths")
    return [_absolute(Path(v), base) for v in value]


def _absolute(path: Path, base: Path | None = None) -> Path:
    path = Path(os.path.expanduser(str(path)))
    if not path.is_absolute() and base is not None:
        path = base / path
    return Path(os.path.abspath(path))


def venv_doc(venv: Path) -> dict:
    """``<venv>/.envvault.toml`` as a document (empty when there is none): the one reader of that file, for
    the caches' ``[caches]`` and the guard's ``[guard]`` tables. Unreadable or not TOML: ``UsageError``."""
    from ..errors import CorruptError
    from ..vault.fsutil import read_regular

    path = venv / VENV_FILE
    try:  # a FIFO or a device put there is never waited on
        text = read_regular(path, 1 << 20, str(path), follow=True).decode("utf-8")
    except FileNotFoundError:
        return {}
    except (UnicodeDecodeError, OSError, CorruptError) as err:
        raise UsageError(f"{path} cannot be read ({err}); fix or remove it") from None
    from envvault.model.encoding import toml_loads

    try:
        return toml_loads(text)
    except ValueError as err:  # tomllib.TOMLDecodeError
        raise UsageError(f"{path} is not valid TOML ({err}); fix or remove it") from None


def _venv_table(venv: Path) -> dict:
    table = venv_doc(venv).get("caches", {})
    if not isinstance(table, dict):
        raise UsageError(f"{venv / VENV_FILE}: [caches] must be a table")
    return table

"""A venv's ``pyvenv.cfg`` settings as a snapshot recorded them (``PythonInfo.venv_settings``: the keys that
change how the environment behaves), put back by ``restore`` in place and made by ``restore --into``; the
other keys (``home``, ``version``...) describe the interpreter found and are left as the file has them."""

from __future__ import annotations

import re
from pathlib import Path

from envvault.env.probe import read_pyvenv_cfg
from envvault.errors import CorruptError
from envvault.model.snapshot import PythonInfo, settings_of
from envvault.restore.installed import replace_file

__all__ = ["pyvenv_wanted", "settings_to_set", "apply_settings", "settings_differences"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def pyvenv_wanted(python: PythonInfo) -> dict[str, str | None]:
    """The settings to reproduce (None for a key to leave absent); nothing when the snapshot recorded no
    pyvenv.cfg. Each checked to be a one-line text (it becomes a line of the file, which a line break would
    turn into a second key): a CorruptError otherwise, for the snapshot may be anyone's."""
    wanted = python.venv_settings() or {}
    for k, v in wanted.items():
        if v is not None and (not isinstance(v, str) or _CONTROL.search(v)):
            raise CorruptError(f"the snapshot's pyvenv.cfg {k} is not a one-line text ({v!r:.60}); refused")
    return wanted


def _found(dest: Path) -> dict:
    """The settings ``dest``'s pyvenv.cfg holds now, read as the snapshot's were (``venv_settings``)."""
    return settings_of(read_pyvenv_cfg(dest) or {})


def settings_to_set(dest: Path, python: PythonInfo) -> dict[str, str | None]:
    """The recorded settings ``dest``'s pyvenv.cfg differs in (``{key: wanted value or None}``); nothing when
    the snapshot recorded no pyvenv.cfg or ``dest`` has none (a system environment)."""
    wanted = pyvenv_wanted(python)
    if not wanted or not (dest / "pyvenv.cfg").is_file():
        return {}
    found = _found(dest)
    return {k: v for k, v in wanted.items() if found.get(k) != v}


def apply_settings(dest: Path, wanted: dict) -> None:
    """Write ``wanted`` into ``dest``'s pyvenv.cfg (a key with None removed), the other lines as they are; the
    file replaced whole (a rename: the old one or the new one, never half)."""
    if not wanted:
        return
    from envvault.vault.fsutil import read_regular

    lines = read_regular(dest / "pyvenv.cfg", 1 << 20, "pyvenv.cfg", follow=True).decode("utf-8", "replace").splitlines()
    kept = [ln for ln in lines if ln.partition("=")[0].strip() not in wanted]
    kept += [f"{k} = {v}" for k, v in wanted.items() if v is not None]
    replace_file(dest / "pyvenv.cfg", ("\n".join(kept) + "\n").encode("utf-8"))


def settings_differences(dest: Path, wanted: dict) -> list[str]:
    """One line for each of ``wanted`` that ``dest``'s pyvenv.cfg does not hold."""
    found = _found(dest)
    return [f"pyvenv.cfg {k} is {found.get(k)!r}, the snapshot had {v!r}" for k, v in wanted.items()
            if found.get(k) != v]

"""A pylock.toml (PEP 751) as an environment document ``diff`` and ``restore`` can compare with a snapshot
(``model.snapshot.loose_snapshot`` reads it): packages by name and version, plus the ids envvault's own
exports carry under ``[packages.tool.envvault]``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["lockfile_document"]


def lockfile_document(path: Path) -> dict:
    """A pylock.toml (PEP 751) as a document diff can compare: packages by name and version, plus the
    build and state ids envvault's own exports carry under ``[packages.tool.envvault]``."""
    from envvault.errors import CorruptError, NotFoundError
    from envvault.model.encoding import toml_loads
    from envvault.vault.fsutil import read_regular

    try:  # a FIFO or a device given as the lockfile is refused at once, never waited on
        data = toml_loads(read_regular(path, 64 << 20, str(path), follow=True).decode("utf-8"))
    except FileNotFoundError:
        raise NotFoundError(f"no lockfile at {path}") from None
    except (OSError, ValueError) as err:
        raise CorruptError(f"{path} is not a readable pylock.toml ({err})") from None
    if not isinstance(data.get("packages"), list):
        raise CorruptError(f"{path} is not a pylock.toml: it has no [[packages]]")
    packages = []
    for i, pkg in enumerate(data["packages"]):
        if not isinstance(pkg, dict) or not isinstance(pkg.get("name"), str):
            raise CorruptError(f"{path}: packages[{i}].name is missing")
        tool = (pkg.get("tool") or {}).get("envvault") or {}
        from packaging.utils import canonicalize_name

        packages.append({
            "name": canonicalize_name(pkg["name"]),
            "version": str(pkg.get("version") or ""),
            "build_id": tool.get("build_id"),
            "state_id": tool.get("state_id"),
            "identity": tool.get("identity", 1),
            "build_info": tool.get("build_info"),
            "modified": list(tool.get("modified_files") or ()),
            "missing": [],
        })
    packages.sort(key=lambda p: (p["name"], p["version"]))
    ev = (data.get("tool") or {}).get("envvault") or {}
    python = {"version": ev["python"], "abi": ev.get("abi")} if ev.get("python") else None
    return {"kind": "lockfile", "venv": None, "python": python, "host": None, "env": None, "packages": packages}

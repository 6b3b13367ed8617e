"""Export a snapshot as a PEP 751 ``pylock.toml`` (plus rebuilt wheels) or a requirements file."""

from __future__ import annotations

import os
from pathlib import Path

import tomli_w

from envvault import __version__
from envvault.errors import UsageError
from envvault.lock.wheels import rebuild_wheel
from envvault.vault.fsutil import atomic_write
from envvault.vault.store import Vault

__all__ = ["export_snapshot", "pylock_document", "original_source"]


def original_source(man: dict) -> dict | None:
    """The wheel URL and hash from ``direct_url.json``, when the installer recorded them."""
    du = man.get("direct_url") or {}
    url = du.get("url")
    info = du.get("archive_info")
    if not url or info is None:
        return None
    hashes = dict(info.get("hashes") or {})
    if not hashes and "=" in (info.get("hash") or ""):
        algo, value = info["hash"].split("=", 1)
        hashes[algo] = value
    return {"url": url, "hashes": hashes} if hashes else {"url": url}


def pylock_document(doc: dict, entries: list[dict]) -> dict:
    """``entries``: per package {summary, wheel: {name, path, size, sha256} | None, source}."""
    packages = []
    for e in entries:
        p = e["summary"]
        pkg: dict = {"name": p["name"], "version": p["version"]}
        wheel = e.get("wheel")
        src = e.get("source")
        if wheel is not None:
            w = {"name": wheel["name"], "path": wheel["path"], "size": wheel["size"],
                 "hashes": {"sha256": wheel["sha256"]}}
            pkg["wheels"] = [w]
        elif src and src.get("hashes") and src["url"].endswith(".whl"):
            pkg["wheels"] = [{"name": src["url"].rsplit("/", 1)[-1], "url": src["url"], "hashes": src["hashes"]}]
        tool = {"build_id": p["build_id"], "state_id": p["state_id"], "identity": p.get("identity", 1),
                "snapshot": e["snapshot"]}
        if p.get("installer"):
            tool["installer"] = p["installer"]
        if p.get("build_info"):
            tool["build_info"] = {k: v for k, v in p["build_info"].items() if v is not None}
        if p.get("modified"):
            tool["modified_files"] = p["modified"]
        if src:
            tool["source"] = src
        pkg["tool"] = {"envvault": tool}
        packages.append(pkg)
    py = doc["python"]["version"]
    return {
        "lock-version": "1.0",
        "created-by": "envvault",
        "requires-python": f"=={py}",
        "packages": packages,
        "tool": {"envvault": {"version": __version__, "snapshot": entries[0]["snapshot"] if entries else None,
                              "python": doc["python"]["version"], "abi": doc["python"].get("abi")}},
    }


def export_snapshot(vault: Vault, sid: str, out: Path, *, fmt: str = "pylock", wheels: bool = True) -> dict:
    """Write the lockfile (and, for pylock, a ``<stem>.wheels/`` folder beside it). Returns a summary."""
    ref = vault.load_snapshot(sid)
    doc = ref.doc
    warnings: list[str] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "requirements":
        lines = [f"# exported by envvault {__version__} from snapshot {sid}", f"# python {doc['python']['version']}"]
        for p in doc["packages"]:
            lines.append(f"{p['name']}=={p['version']}  # build {p['build_id'][:16]}")
        atomic_write(out, ("\n".join(lines) + "\n").encode(), mode=0o644)
        return {"path": str(out), "format": fmt, "packages": len(doc["packages"]), "warnings": warnings}
    if fmt != "pylock":
        raise UsageError(f"unknown export format {fmt!r}; use pylock or requirements")
    wheel_dir = out.parent / f"{out.stem}.wheels"
    if doc.get("lock_only"):
        entries, lock_warnings = _lock_only_entries(vault, sid, doc, wheel_dir, out.parent, wheels)
        atomic_write(out, tomli_w.dumps(pylock_document(doc, entries)).encode(), mode=0o644)
        n_wheels = sum(1 for e in entries if e["wheel"])
        return {"path": str(out), "format": fmt, "packages": len(entries), "wheels": n_wheels,
                "wheel_dir": str(wheel_dir) if n_wheels else None, "warnings": warnings + lock_warnings}
    entries = []
    n_wheels = 0
    for p in doc["packages"]:
        man = vault.get_json(p["manifest"]) if (not doc.get("lock_only") and vault.has(p["manifest"])) else None
        src = original_source(man) if man else None
        entry = {"summary": p, "snapshot": sid, "source": src, "wheel": None}
        if wheels and man is not None and man.get("record") == "ok":
            wheel_dir.mkdir(parents=True, exist_ok=True)
            path, sha, size = rebuild_wheel(vault, man, doc["python"], wheel_dir)
            entry["wheel"] = {"name": path.name, "path": os.path.relpath(path, out.parent), "size": size, "sha256": sha}
            n_wheels += 1
        elif man is None or man.get("record") != "ok":
            warnings.append(f"{p['name']} {p['version']}: files not in the vault; the lock names it without a source")
        entries.append(entry)
    atomic_write(out, tomli_w.dumps(pylock_document(doc, entries)).encode(), mode=0o644)
    return {"path": str(out), "format": fmt, "packages": len(entries), "wheels": n_wheels,
            "wheel_dir": str(wheel_dir) if n_wheels else None, "warnings": warnings}


def _lock_only_entries(vault: Vault, sid: str, doc: dict, wheel_dir: Path, base: Path, wheels: bool):
    """A lock-only snapshot's packages from stored copies of their builds, else recorded URLs
    (``envvault.lock.sources``, the rule restore uses too)."""
    from envvault.lock.sources import describe, pylock_entries, resolve_sources

    sources = resolve_sources(vault, doc, copies=wheels)
    warnings = [w for s in sources for w in [describe(s)] if w]
    warnings += [f"{s.package['name']} {s.package['version']}: no stored copy of its build and no recorded URL; "
                 "the lock names it without a source" for s in sources if not s.known]
    return pylock_entries(vault, sid, doc, sources, wheel_dir, base), warnings

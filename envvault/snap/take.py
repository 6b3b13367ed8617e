"""Taking a snapshot: scan the environment (``scan.py``), call the cache hook, store what is new, commit the
snapshot document last."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from envvault import __version__
from envvault.crashpoints import crash_point
from envvault.env.host import host_facts, relevant_env
from envvault.model.encoding import canonical_json
from envvault.model.identity import fingerprint
from envvault.vault.ingest import Ingester, StatCache
from envvault.vault.store import FORMAT, Vault, _now

from .scan import scan_environment

__all__ = ["take_snapshot", "SnapResult", "CacheHook"]

CacheHook = Callable[[Vault, Ingester, StatCache], "list[dict]"]


@dataclass(frozen=True)
class SnapResult:
    id: str
    doc: dict

    def to_json(self) -> dict:
        d = self.doc
        return {
            "id": self.id,
            "short_id": self.id[:12],
            "created": d["created"],
            "message": d["message"],
            "venv": d["venv"],
            "packages": len(d["packages"]),
            "files": d["stats"]["files"],
            "bytes": d["stats"]["bytes"],
            "new_bytes": d["stats"]["new_bytes"],
            "new_objects": d["stats"]["new_objects"],
            "lock_only": d["lock_only"],
            "fingerprint": d["fingerprint"],
            "warnings": d["warnings"],
        }


def take_snapshot(
    vault: Vault,
    prefix: Path,
    *,
    message: str = "",
    lock_only: bool = False,
    trigger: str = "manual",
    argv: list[str] | None = None,
    progress: Callable[[int], None] | None = None,
    cache_hook: CacheHook | None = None,
    extra: dict | None = None,
) -> SnapResult:
    """Snapshot ``prefix`` into ``vault``. Objects first, then the snapshot file (the commit point)."""
    started = time.monotonic()
    with vault.lock():
        writer = vault.writer()
        try:
            interp, packages, warnings, cache, ing, stats = scan_environment(
                vault, prefix, mode="lock" if lock_only else "full", writer=writer, progress=progress
            )
            caches = cache_hook(vault, ing, cache) if cache_hook else []
            writer.flush()
        except BaseException:
            writer.abort()
            raise
        writer.close()
        crash_point("snap_objects")
        doc = {
            "format": FORMAT,
            "kind": "snapshot",
            "created": _now(),
            "message": message,
            "trigger": trigger,
            "argv": list(argv if argv is not None else sys.argv),
            "venv": str(prefix),
            "lock_only": lock_only,
            "python": interp.to_dict(),
            "host": host_facts(),
            "env": relevant_env(),
            "packages": packages,
            "caches": caches,
            "fingerprint": fingerprint(interp.version, packages),
            "warnings": warnings + [f"cache {c.get('kind')} {c.get('root')}: {w}" for c in caches
                                    for w in c.get("warnings", ())],
            "stats": {
                "files": stats["files"],
                "bytes": stats["bytes"],
                "new_bytes": writer.written_bytes,
                "new_objects": writer.written_objects,
                "seconds": round(time.monotonic() - started, 3),
            },
            "tool": {"envvault": __version__},
        }
        if extra:
            doc.update(extra)
        doc["stats"]["new_bytes"] += len(canonical_json(doc))
        sid = vault.commit_snapshot(doc)
    cache.save()
    return SnapResult(sid, doc)

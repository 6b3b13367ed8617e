"""Taking a cache-only snapshot, and the cache hook an environment's snap calls: which roots
(``roots.py``), each archived through the snap's ``Ingester`` (``archive.py``) with the environment's
fingerprint (``snap_fingerprint.py``); the cache-only snapshot document is committed last, as every snap's.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

from ..errors import EnvironmentProblem, NotFoundError
from ..model.encoding import recordable
from ..vault.ingest import Ingester
from ..vault.statcache import StatCache
from ..vault.transaction import Committed
from .archive import archive_cache
from .discover import usable_kinds
from .roots import locations_to_snap
from .snap_fingerprint import environment_fingerprint


__all__ = ["CacheSnapResult", "make_cache_hook", "take_cache_snapshot"]


class CacheSnapResult(Committed):
    """A committed cache-only snapshot: its id and the validated record."""

    def extra_json(self) -> dict:
        return {"caches": [c.to_dict() for c in self.snapshot.caches or ()]}

    def tail_json(self) -> dict:
        return {"seconds": self.snapshot.stats.seconds}


if TYPE_CHECKING:
    # What an environment's snap calls inside its transaction: (vault, the snap's ingester, its stat cache) ->
    # the snapshot's cache entries.
    CacheHook = Callable[[Any, Ingester, StatCache], "list[dict]"]


def make_cache_hook(
    vault,
    target: Path | None,
    extra_dirs: Sequence[Path] = (),
    *,
    env: Mapping[str, str] = os.environ,
    discover: bool = True,
    use_torch_python: Path | None = None,
    usable_only: bool = True,
) -> CacheHook:
    """The ``cache_hook`` for ``take_snapshot``: archives the caches of a process started with ``env``
    (plus ``extra_dirs`` and the configured dirs), fingerprinted against ``target``'s torch.

    With ``usable_only`` (an environment's snap), a discovered cache is taken only when ``target`` can use
    it (:func:`~envvault.caches.discover.usable_kinds`: no Inductor cache for a venv without torch); the
    ``--cache-dir`` and configured folders always are. ``cache snap`` passes False: it archives what it finds.
    """
    from .config import configured_dirs

    def hook(vault_, ingester: Ingester, statcache: StatCache) -> list[dict]:
        extra = list(extra_dirs) + configured_dirs(vault_.settings(), target)
        kinds = usable_kinds(target) if usable_only and target is not None else None
        locations = locations_to_snap(env, extra, discover=discover, use_torch_python=use_torch_python,
                                      kinds=kinds, named=extra_dirs)
        env_fp, why = environment_fingerprint(target, statcache, env)
        entries = []
        for loc in locations:
            try:
                entries.append(archive_cache(vault_, ingester, statcache, loc, env_fp=env_fp))
            except NotFoundError:
                continue  # removed since it was found: nothing to archive
            except EnvironmentProblem as err:
                # An unreadable cache must not fail the environment's snap: record why it is missing.
                root = recordable(str(loc.path))  # a path that is not UTF-8 is the reason, written as typed
                entries.append({"kind": loc.kind, "root": root, "reason": loc.reason, "manifest": None,
                                "files": 0, "bytes": 0, "entries": {}, "fingerprint": None,
                                "warnings": [f"{root}: not archived: {err}"]})
        if why and entries:
            entries[0]["warnings"] = entries[0]["warnings"] + [why]
        return entries

    return hook


def take_cache_snapshot(
    vault,
    *,
    venv: Path | None = None,
    extra_dirs: Sequence[Path] = (),
    discover: bool = True,
    message: str = "",
    env: Mapping[str, str] = os.environ,
    use_torch_python: Path | None = None,
    argv: list[str] | None = None,
) -> CacheSnapResult:
    """Archive the caches alone into a snapshot of kind ``cache-snapshot`` (no packages). ``venv`` is the
    environment that uses the caches, for their fingerprint; it may be None. Objects first, then the
    snapshot file (the commit point), as every snap."""
    from envvault import __version__
    from envvault.env.host import host_facts_cached, relevant_env
    from envvault.model.snapshot import build_snapshot
    from envvault.model.encoding import utc_timestamp
    from envvault.vault.transaction import snapshot_transaction

    started = time.monotonic()
    statcache = vault.stat_cache("stat-caches")
    hook = make_cache_hook(vault, venv, extra_dirs, env=env, discover=discover, use_torch_python=use_torch_python,
                           usable_only=False)
    with snapshot_transaction(vault) as txn:
        caches = hook(vault, Ingester(txn.writer, vault.has), statcache)
        txn.flush()
        warnings = [w for c in caches for w in c["warnings"]]
        if not caches:
            warnings.append("no compile cache found: nothing was archived (see `envvault cache list --where`)")
        snapshot = build_snapshot(
            kind="cache-snapshot",
            created=utc_timestamp(),
            message=message,
            trigger="cache-snap",
            argv=list(argv if argv is not None else sys.argv),
            venv=str(venv) if venv else None,
            lock_only=False,
            # No interpreter (every field null): an environment restore of this snapshot refuses, as for an
            # interpreter that differs, instead of removing every package the snapshot does not list.
            python=dict.fromkeys(("implementation", "version", "abi", "soabi", "platform")),
            host=host_facts_cached(statcache),  # nvidia-smi's answer remembered while the driver stays
            env=relevant_env(),
            packages=[],
            caches=caches,
            fingerprint=None,
            warnings=warnings,
            stats={
                "files": sum(c["files"] for c in caches),
                "bytes": sum(c["bytes"] for c in caches),
                "new_bytes": txn.written_bytes,
                "new_objects": txn.written_objects,
                "seconds": round(time.monotonic() - started, 3),
            },
            tool={"envvault": __version__},
        )
        sid = txn.commit(snapshot)
    statcache.save()
    return CacheSnapResult(sid, snapshot)

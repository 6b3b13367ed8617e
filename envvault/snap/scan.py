"""Scanning an environment through its reader (``envvault.env.reader``): each distribution from the stat
cache when RECORD, METADATA and every stored file keep the stats of the last scan (an unchanged environment
is re-scanned from metadata alone), else read (``envvault.env.dists``) and built into a manifest
(``manifests.py``). Three modes: ``full`` (hash and store), ``check`` (hash only: status, diff current),
``lock`` (dist-info only)."""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)

from envvault.env.probe import Interpreter
from envvault.env.reader import reader_for
from envvault.model.encoding import canonical_json, object_id
from envvault.output import ProgressSink
from envvault.vault import timing
from envvault.vault.statcache import (
    StatCache, encode_stats, group_from_portable, portable_group, stat_key, unpacked_group,
)
from envvault.vault.store import Vault

from .fresh import base_of, entry_key, env_cache_name, fresh_groups, journal_left

if TYPE_CHECKING:
    from typing import Iterator
    from envvault.model.manifest import DistManifest

    from .manifests import DistPlan, ManifestBuilder
    from envvault.vault.ingest import Ingester
    from envvault.env.dists import InstalledDist

__all__ = ["scan_environment", "scan_current", "statcache_for", "save_checked"]

def statcache_for(vault: Vault, target: Path, *, fresh: bool = False) -> StatCache:
    """The stat cache of the environment at ``target`` (one per real path: ``stat-<key>``); ``fresh``: an
    empty one for a new environment there, replacing what an earlier one at that path left."""
    return vault.stat_cache(env_cache_name(target), fresh=fresh)


def save_checked(cache: StatCache) -> None:
    """Save the stat cache a check scan used (``scan_current``), keeping every file entry it holds: other
    scans (cache trees) rely on those a check scan does not touch."""
    if getattr(cache, "_files", None) is not None:
        cache.touch(list(cache.files))
    cache.save()


def scan_current(vault: Vault, prefix: Path, *, save_cache: bool = True, facts: bool = True,
                 cache: StatCache | None = None) -> dict:
    """The live environment at ``prefix`` in snapshot shape (packages, python, host, env), read without
    writing to the vault. Files are hashed against RECORD (stat-cached under the vault's ``state/``, which
    ``save_cache`` keeps warm for the next call). ``facts=False`` leaves host and environment variables out
    (None), which spares nvidia-smi when only the environment is compared."""
    import time

    from envvault.model.identity import fingerprint

    interp, packages, warnings, cache, _ing, stats = scan_environment(vault, prefix, mode="check", cache=cache)
    host = None
    if facts:
        from envvault.env.host import host_facts_cached

        host = host_facts_cached(cache)
    if save_cache:
        save_checked(cache)
    if facts:
        from envvault.env.host import relevant_env
    return {
        "kind": "current",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "venv": str(prefix),
        "lock_only": False,
        "python": interp.to_dict(),
        "host": host,
        "env": relevant_env() if facts else None,
        "packages": packages,
        "caches": [],
        "fingerprint": fingerprint(interp.version, packages),
        "warnings": warnings,
        "stats": stats,
    }


def scan_environment(
    vault: Vault,
    prefix: Path,
    *,
    mode: str,
    writer=None,
    progress: ProgressSink | None = None,
    cache: StatCache | None = None,
) -> tuple[Interpreter, list[dict], list[str], StatCache, Ingester | None, dict]:
    """Scan ``prefix``. ``mode``: "full" hashes files and stores new objects through ``writer``; "check"
    hashes files (to find in-place edits) and stores nothing; "lock" reads dist-info only. Manifests are
    queued on ``writer`` when one is given. Returns the interpreter, package summaries, warnings, the stat
    cache, the ingester (always for "full", which a compile cache hook archives through; otherwise None when
    no file was read) and the totals."""
    # A killed restore (its journal in a venv, or a system environment's in the vault's state): clean what it
    # half-made first.
    if journal_left(prefix, vault.state.dir):
        from envvault.journal import settle_interrupted

        settle_interrupted(vault, prefix)
    t0 = timing.clock()
    if cache is None:  # a restore passes the one cache it loads and saves once (HC)
        cache = statcache_for(vault, prefix)
    reader = reader_for(prefix, cache)
    interp = reader.interpreter()
    ing = None  # made once something is read (``_ingester``), or for a full snap's cache hook
    mkey = "manifest_" + mode
    packages: list[dict] = []
    slow: list[InstalledDist] = []
    warnings: list[str] = []
    entries = []  # (dist_info, site, its stat cache group, the manifest id the cache has for this mode)
    base = base_of(prefix)
    listed = []  # the groups' keys, in order: what a verdict (verdict.py) records this scan saw
    for dist_info, site in reader.dist_entries():
        listed.append(entry_key(dist_info, prefix, base))
        group = cache.groups.get(listed[-1])
        # Ids in the stat cache are trusted without consulting the index: the cache is saved only after
        # a commit, and gc deletes every stat cache before it removes anything.
        # A check scan takes the full scan's manifest of the same stats (the same files, chunks recorded).
        mid = group and (group.get(mkey) or (mode == "check" and group.get("manifest_full")))
        entries.append((dist_info, site, group, mid))
    cache.listed = tuple(listed)
    warnings.extend(_passed_over(stash) for stash in getattr(reader, "stashed", ()))
    fresh = fresh_groups(entries, prefix) if mode != "lock" else set()
    pending: list[tuple[Path, Path]] = []  # (dist_info, site) of the distributions to read and build
    for n, (dist_info, site, group, mid) in enumerate(entries):
        if n in fresh:
            summary = dict(group["summary"], manifest=mid)  # an object with its manifest id: group_problem
            if _summary_ok(summary):  # else read again: the new group replaces this one
                packages.append(summary)
                cache.touch_group(group)
                continue
        elif mode == "lock" and group and group.get("lock") and _lock_fresh(group["lock"], dist_info):
            summary = dict(group["lock"]["summary"])
            if _summary_ok(summary):
                packages.append(summary)
                continue
        pending.append((dist_info, site))
    # Every distribution fresh (an unchanged status or second snap): no manifest to build, and the builder's
    # modules are not even imported.
    builder = None
    if pending:
        from .manifests import ManifestBuilder

        ing = _ingester(writer, vault, mode)
        builder = ManifestBuilder(vault, interp, ing, cache, mode)
    # A check scan of many distributions without groups (a venv restore --into just wrote): read and built in
    # forked children. Otherwise read here, built with the reader threads below.
    if builder is not None and not (mode == "check" and writer is None and progress is None
                                    and _built_forked(reader, builder, vault, cache, prefix, pending, packages,
                                                      warnings)):
        slow = [d for d in (reader.read(di, site) for di, site in pending) if d is not None]
    if progress is not None:
        progress.set_total(sum(e.size or 0 for d in slow for e in (d.record or ())))
    warnings.extend(w for w in map(_unstored_warning, slow) if w)
    # Files are read on the ingester's reader threads, distribution after distribution, and their objects
    # stored in this order (then each manifest): the same packs whatever the thread count.
    if timing.ON:
        timing.add("scan: probe, stat cache, dist-info read", t0)
    if builder is not None:
        groups = None  # a first snap's small files, read in groups (groups.py)
        if mode == "full" and writer is not None and vault.local and not cache.files:
            from envvault.vault.threads import default_group_processes

            from .groups import SmallGroups, small_groups

            digests: list = []  # each group's RECORD sha256s, for the links among its files
            found = small_groups(builder, slow, digests)
            if found:
                groups = SmallGroups(vault, found, digests)
                groups.start(default_group_processes())
        planned = _planned(builder, ing, slow, groups)
        try:
            _build_all(planned, builder, writer, vault, cache, prefix, mode, packages, progress)
        finally:
            planned.close()  # on an error, stop the reader threads now
        if groups is not None:
            groups.finish(writer)
        warnings = builder.warnings + warnings
    packages.sort(key=lambda p: (p["name"], p["version"]))
    stats = {"files": sum(p["files"] for p in packages), "bytes": sum(p["size"] for p in packages)}
    if ing is None and mode == "full":
        ing = _ingester(writer, vault, mode)  # a compile cache hook archives through it
    return interp, packages, warnings, cache, ing, stats


def _ingester(writer, vault: Vault, mode: str) -> "Ingester":
    """The ingester a scan reads files through (``vault/ingest.py``: its import, with the pack writer's, is a
    fifth of a lock-only snap's or an unchanged check scan's start, which read no file)."""
    from envvault.vault.ingest import Ingester

    return Ingester(writer, vault.has, store=mode == "full", threads=1 if mode == "lock" else None)


def _unstored_warning(dist: InstalledDist) -> str | None:
    """Why a distribution's files are not stored, when they are not."""
    if dist.kind == "egg-link":
        return (f"{dist.display} is an old-style editable ({dist.dist_info.name}): its files live outside the "
                f"environment, in {dist.target or '?'}, and are not stored")
    if dist.record is None and dist.installer == "debian":  # a system environment's (env/system.py)
        return (f"{dist.display} is managed by the system package manager and has no RECORD: its files are not "
                "stored; restore it with apt")
    if dist.record is None:
        return (f"{dist.display} has no RECORD ({dist.kind} install): its files are not stored; reinstall it with "
                "pip to make it restorable")
    return None


def _build_all(planned, builder, writer, vault, cache, prefix, mode, packages, progress) -> None:
    done = 0
    for plan in planned:
        dist = plan.dist
        t0 = timing.clock()
        packages.append(_build_one(plan, builder, writer, vault, cache, prefix, mode))
        done += sum(e.size or 0 for e in (dist.record or ()))
        if progress:
            progress(done)
        if timing.ON:
            timing.add("scan: manifests built and stored (main thread)", t0)


def _build_one(plan, builder, writer, vault, cache, prefix, mode) -> dict:
    """The summary of one distribution whose reads are done: its manifest built (and queued on ``writer``),
    what the stat cache learns remembered."""
    from .manifests import summary_of

    dist = plan.dist
    man = builder.finish(plan)
    data = canonical_json(man.to_dict())
    oid = object_id(data)
    if writer is not None and not vault.has(oid) and not writer.queued(oid):
        writer.add(oid, data, "m")
    summary = summary_of(man, oid)
    if builder.interp.environment != "venv":  # its site directory (docs/format.md, "Environment kinds")
        summary["site"] = posixpath.dirname(man.dist_info)
    if dist.record is not None:
        try:
            remember_group(cache, dist.dist_info, prefix, man, summary, mode, oid)
        except OSError:
            pass
    return summary


def _built_forked(reader, builder, vault, cache, prefix, pending: list, packages: list, warnings: list) -> bool:
    """A check scan's distributions (``pending``: dist-info folders and their sites) read and built in forked
    children (``forked.map_all``) when it pays: each answers a distribution's summary, its stat cache group,
    the file entries of the files it read, its warnings and why its files are not stored (if so), applied here
    in the distributions' order (this process's own answers go the same way). False, with nothing done, when
    one process would do them all (the reader threads' path is then faster), and when any distribution failed
    (a RECORD gone, a file that cannot be read): the one-process scan then says why, the same error in the same
    order as without children."""
    from envvault.vault.forked import map_all, workers_for

    weights = []
    for dist_info, _ in pending:  # the RECORD's bytes, about 100 a file
        try:
            weights.append(os.stat(dist_info / "RECORD").st_size // 100 + 1)
        except OSError:
            weights.append(1)
    if len(pending) < 2 or workers_for(sum(weights)) < 2:
        return False
    cache.files  # loaded once, before any fork
    weight, path = _read_fns()

    def read(need, read_file):
        return need, read_file(need.absolute, need.size, pin=need.pin)

    def answer(item) -> bytes:
        seen = len(builder.warnings)
        try:
            dist = reader.read(*item)
            if dist is None:
                return b"null"
            plan = builder.plan(dist)
            if plan.reads:  # files changed since their entries: read on the reader threads, as without children
                for need, fd in builder.ing.map_ordered(read, plan.reads, weight=weight, path=path):
                    builder.took(need, fd)
            summary = _build_one(plan, builder, None, vault, cache, prefix, "check")
            built = builder.warnings[seen:]
        except Exception:  # noqa: BLE001 - the one-process scan raises it, in its order
            return b""
        finally:
            del builder.warnings[seen:]  # they come back with the answer, in order
        key = dist.dist_info.relative_to(prefix).as_posix()
        return json.dumps({
            "summary": summary,
            # [key, None]: no group (remember_group keeps none for a distribution with a link)
            "group": [key, portable_group(cache.groups[key]) if key in cache.groups else None]
            if dist.record is not None else None,
            "files": {need.rel: cache.files[need.rel] for need in plan.reads},
            "warnings": built,
            "unstored": _unstored_warning(dist),
        }, separators=(",", ":")).encode()

    answers = map_all(answer, pending, weights)
    if b"" in answers:
        return False
    for raw in answers:
        got = json.loads(raw)
        if got is None:
            continue
        packages.append(got["summary"])
        if got["group"] is not None:
            key, group = got["group"]
            if group is None:
                cache.drop_group(key)
            else:
                cache.set_group(key, group_from_portable(group))
                cache.touch_group(cache.groups[key])  # its files' entries were used, as a child's lookups say
        cache.learn(got["files"])
        builder.warnings.extend(got["warnings"])
        if got["unstored"]:
            warnings.append(got["unstored"])
    return True


def _read_fns():
    """``(weight, path)`` for ``map_ordered`` over reads and plans: a read's bytes and the file it reads; None
    for a plan (its manifest is stored before the next distribution's objects)."""
    from .manifests import DistPlan

    def weight(item) -> int | None:
        return None if isinstance(item, DistPlan) else item.size

    def path(item):  # (a pinned read is never named ahead: only the read that checks its stat key reads it)
        return None if isinstance(item, DistPlan) or item.link is not None else item.absolute

    return weight, path


def _plans_ahead(builder: ManifestBuilder, dists: list) -> Iterator[DistPlan]:
    """``builder.plan`` of each distribution, in order, made on a thread of its own a few distributions ahead:
    planning (an lstat and a stat-cache lookup a file) then overlaps the storing thread's waits. Its error is
    raised here, at that distribution's turn; closing the generator stops the thread."""
    import queue
    import threading

    builder.cache.files  # loaded here: the planning thread only reads it
    out: queue.Queue = queue.Queue(maxsize=4)
    stop = threading.Event()

    def send(item) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for dist in dists:
                if not send(("plan", builder.plan(dist))):
                    return
        except BaseException as err:  # noqa: BLE001 - raised on the consuming side
            send(("error", err))
            return
        send(("done", None))

    thread = threading.Thread(target=run, name="envvault-plan", daemon=True)
    thread.start()
    try:
        while True:
            kind, got = out.get()
            if kind == "done":
                return
            if kind == "error":
                raise got
            yield got
    finally:
        stop.set()
        thread.join()


def _planned(builder: ManifestBuilder, ing: Ingester, dists: list, groups=None) -> Iterator[DistPlan]:
    """Each distribution's plan with every read done, in order; reads run ahead on the reader threads. A file
    of ``groups`` (``groups.SmallGroups``) read there under the stat key its plan found is not read again:
    its digest is taken as it is."""
    if not dists:
        return
    from .manifests import DistPlan

    plans = _plans_ahead(builder, dists) if ing.threads > 1 else map(builder.plan, dists)

    def items():
        for plan in plans:
            yield from plan.reads
            yield plan  # the marker: every read of this plan comes before it

    def run(item, read):
        if isinstance(item, DistPlan):
            return item
        if groups is not None:
            got = groups.digest(item.absolute, item.key)
            if got is not None:
                return item, got
        return item, read(item.absolute, item.size, pin=item.pin)

    weight, path = _read_fns()
    results = ing.map_ordered(run, items(), weight=weight, path=path)
    try:
        for got in results:
            if isinstance(got, DistPlan):
                yield got
            else:
                builder.took(*got)
    finally:
        results.close()
        close = getattr(plans, "close", None)
        if close is not None:
            close()


def _passed_over(entry: Path) -> str:
    """The warning for a distribution entry a reader passed over (``env/entries.entry_kind``)."""
    from envvault.env.entries import entry_kind

    if entry_kind(entry.name) == "unnamed":
        return (f"{entry}: a distribution folder whose name is not UTF-8 text, which no snapshot can record; left "
                "out: rename it, or reinstall that package")
    return f"{entry}: a folder pip moved aside while it installs or uninstalls (running now, or killed); left out, as pip leaves it out"


def _summary_ok(summary: dict) -> bool:
    """A package summary from the stat cache that the snapshot model takes as it is (the model's one parser:
    a group whose files all match but whose summary does not parse is read again, never a failed command)."""
    from envvault.model.snapshot import parse_package_summary

    problems: list[str] = []
    parse_package_summary(summary, "", problems)
    return not problems


def _lock_fresh(lock: dict, dist_info: Path) -> bool:
    try:
        return (stat_key(os.stat(dist_info / "RECORD")) == lock["record_stat"]
                and stat_key(os.stat(dist_info / "METADATA")) == lock["meta_stat"])
    except (OSError, KeyError):
        return False


def remember_group(cache: StatCache, dist_info: Path, prefix: Path, man: DistManifest, summary: dict, mode: str,
                   oid: str) -> None:
    """Record what a scan learnt about one distribution (its dist-info folder ``dist_info``), for the fast
    path of the next one; a restore records the distributions it wrote the same way (``restore/apply.py``
    ``remember_written``).

    A group holds the stats of the distribution's files and, per mode, the manifest built from exactly
    those stats; manifests of other modes survive only while the stats are unchanged.
    """
    key = dist_info.relative_to(prefix).as_posix()
    old = cache.groups.get(key) or {}
    record_stat = stat_key(os.stat(dist_info / "RECORD"))
    try:
        meta_stat = stat_key(os.stat(dist_info / "METADATA"))
    except FileNotFoundError:  # METADATA gone, RECORD listing it (``dists._named_by_folder``): no fast path
        cache.drop_group(key)
        return
    if mode == "lock":
        group = dict(old)
        group["lock"] = {"record_stat": record_stat, "meta_stat": meta_stat, "summary": summary}
        cache.set_group(key, group)
        return
    if any(f.link is not None and f.path not in cache.files for f in man.files):
        # No group: a link this scan did not read through (one leading to no regular file, a RECORD row
        # without a hash, one a restore wrote) has no stats of what it leads to that the group could check;
        # the next scan builds this distribution's manifest again.
        cache.drop_group(key)
        return
    # A link's stats are those of the file it leads to, as read (``manifests._link_state``): the group's
    # check follows links (``group_stats_fresh``), so a link retargeted or what it leads to edited is stale.
    stored = [f.path for f in man.files if f.path in cache.files and f.mode is not None]
    stats = [cache.files[rel][0] for rel in stored]
    missing = [f.path for f in man.files if f.state == "missing"]
    files_field, stats_field = encode_stats(stored, stats)
    group = {
        "record_stat": record_stat,
        "meta_stat": meta_stat,
        "files": files_field,
        "stats": stats_field,
        # Files that were missing must still be missing (a restore, or a user, may put them back).
        "missing": missing,
        "summary": {k: v for k, v in summary.items() if k != "manifest"},
        "manifest_" + mode: oid,
    }
    unpacked_group(old)  # its files and stats, when the groups file still holds them
    unchanged = all(old.get(k) == group[k] for k in ("record_stat", "meta_stat", "files", "stats", "missing"))
    for k in ("manifest_full", "manifest_check"):
        if unchanged and k in old and k not in group:
            group[k] = old[k]
    if "lock" in old:
        group["lock"] = old["lock"]
    cache.set_group(key, group)

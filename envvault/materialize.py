"""Putting files from a vault into a folder tree: the one materializer of the environment restore
(``restore/apply.py``) and the cache restore (``caches/restore.py``).

A restore names what it writes as ``FileSpec`` records (a path under the root, the chunks that make the file
or the symlink target, size, sha256, mode). Here, and nowhere else:

- ``refuse_escapes``: every entry decided against the tree as the restore leaves it (the one rule of
  ``envvault.safepaths.FinalTree``); any that lies under, or is a symlink resolving to, a place outside the
  root refuses the whole restore before anything is written (up to 10 named in the one error line).
- ``stage``: every file written under its temp name beside its final path (the caller's naming:
  ``.<name>.envvault-<pid>.tmp`` in an environment, ``.<name>.envvault-<pid>-<run>.tmp`` in a cache root),
  read from the vault in pack order (contiguous runs, one per thread at a time, the largest taken first;
  each frame is decompressed about once), every object's BLAKE3 checked by the reader and each file's size and sha256
  checked while writing. Modes lose setuid, setgid and sticky; a file is created with its mode where the
  umask leaves it whole (one system call fewer a file; a folder's default ACL, which overrides the umask, is
  caught by the ``fstat`` after writing), else created private and given it after writing.
  The threads run under ``busy_threads`` (a short GIL switch interval, no garbage collection). A failure
  deletes every temp file of the run and nothing is renamed. Crash point ``stage`` after each file.
  A new tree that nothing uses yet (``restore --into``) is written under final names (``FINAL_NAME``): no
  temp names and no renames, as an installer writes; its caller removes the tree on failure, and its folders
  are made by the writer that first finds one missing (``folders``). Out of a vault in a folder, 64 MiB or
  more to write (under temp or final names) is written by forked processes of one thread each
  (``_stage_forked``, ``threads.default_write_processes``: on the 16-core GPU host 16 processes wrote the
  7.3 GB venv's 49,405 files in half the time of 8 threads, which waited on each other for the GIL); the
  threads of this process otherwise, and under a crash test (its kill points are in this process).
- ``place`` / ``place_link``: rename a staged file into place (over what is there, or, ``keep_existing``,
  never over an entry that appeared meanwhile: ``link`` + ``unlink``).

Files are not fsynced (the guarantee is against a killed process: only complete files under final names).
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from contextlib import nullcontext
from envvault.model.records import dataclass

TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Callable, Iterable, Iterator, Mapping, Sequence

    TempName = Callable[[str], str]  # final absolute path -> the temp path beside it, alike in every process

from envvault.crashpoints import crash_point
from envvault.errors import CorruptError, EnvironmentProblem, RefusedError
from envvault.env.static import WHOLE_FILE_LIMIT
from envvault.safepaths import FinalTree, reserved_problem
from envvault.vault.fsutil import current_umask, storage_error
from envvault.vault import timing
from envvault.vault.threads import busy_threads, default_restorers
from envvault.model.record import record_sha256
from envvault.vault.store import ObjectReader

__all__ = ["FileSpec", "Staged", "refuse_escapes", "refuse_folders_in_the_way", "stage", "stored_bytes", "discard", "place",
           "place_link", "pack_position", "FINAL_NAME", "WORKERS"]


def FINAL_NAME(final: str) -> str:  # noqa: N802 (a TempName constant)
    """The ``TempName`` of a new tree nothing uses yet: each file is written under its final name."""
    return final


WORKERS = default_restorers()  # vault/threads.py
_RUN_BYTES = 16 << 20  # a thread is handed contiguous runs of at most about this many bytes ...
_RUN_FILES = 16  # ... and, below that, at least this many files


@dataclass(frozen=True, slots=True)
class FileSpec:
    """One file to put under the root: the concatenation of ``chunks`` (or, with ``link``, a symlink)."""

    path: str  # relative to the root, already checked (``FinalTree``)
    chunks: tuple[str, ...] = ()
    size: int = 0
    sha256: str | None = None  # None: the record has no hash (RECORD itself); size is still checked
    mode: int = 0o644
    link: str | None = None
    owner: str | None = None  # named in messages: the distribution the file belongs to
    data: bytes | None = None  # the bytes themselves (a file the restore generates: a RECORD, a rewritten
    # script), written instead of ``chunks``; size and sha256 are checked all the same


@dataclass(frozen=True, slots=True)
class Staged:
    """A file written and checked under its temp name, not yet in place."""

    spec: FileSpec
    tmp: str
    final: str
    sha256: str | None  # as computed while writing (None for a symlink)
    st: os.stat_result | None = None  # the file's stats as written, when written under its final name


def stored_bytes(reader, f, owner: str | None = None) -> bytes:
    """The bytes of a stored manifest file ``f`` (its ``chunks``, each checked against its id by ``reader``:
    an ``ObjectReader`` or a ``Vault``), for a file read whole into memory (a RECORD, a script to rewrite, a
    provenance file, entry points). ``CorruptError`` as soon as the chunks add up to more than ``f.size``:
    a few KiB of manifest never asks for more memory than the file it describes, and one that records more
    than ``WHOLE_FILE_LIMIT`` (64 MiB) is refused before a byte is read."""
    limit = int(f.size or 0)
    if limit > WHOLE_FILE_LIMIT:
        who = f" ({owner})" if owner else ""
        raise CorruptError(f"{f.path}{who}: {limit} bytes recorded for a file envvault reads whole (at most "
                           f"{WHOLE_FILE_LIMIT >> 20} MiB); refused")
    parts: list[bytes] = []
    total = 0
    for oid in f.chunks or ():
        data = reader.get(oid)
        total += len(data)
        if total > limit:
            who = f" ({owner})" if owner else ""
            raise CorruptError(f"{f.path}{who}: the vault's objects make more than the {limit} bytes recorded; "
                               "run `envvault verify --read-data`")
        parts.append(bytes(data))
    return b"".join(parts)


# -- before anything is written --------------------------------------------------------------------


def refuse_escapes(root: str | os.PathLike, refusing: str, *, links: Mapping[str, str] | None = None,
                   entries: Iterable[str] = (), dirs: Iterable[str] = (), where: str = "the environment",
                   scripts: Iterable[str] | None = None) -> None:
    """``RefusedError`` ("<refusing>: path: why; ...") when any entry leads out of the final tree, or, for an
    environment (``scripts``: its scripts folders), is its interpreter or its pyvenv.cfg
    (``safepaths.reserved_problem``)."""
    entries = list(entries)
    bad = FinalTree(root, links=links, entries=entries, dirs=dirs, where=where).problems()
    if scripts is not None:
        scripts = set(scripts)
        bad += [f"{p}: {why}" for p in sorted({*entries, *(links or {})}) if (why := reserved_problem(p, scripts))]
    if bad:
        more = f"; and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise RefusedError(f"{refusing}: " + "; ".join(bad[:10]) + more)


# -- staging ---------------------------------------------------------------------------------------


def pack_position(reader: ObjectReader, chunks: Sequence[str]) -> tuple:
    """Where a file's first chunk lies: writing files in this order reads each frame once."""
    loc = reader.locate(chunks[0], refresh=False) if chunks else None
    return (loc[0], loc[1], loc[3]) if loc else ("", 0, 0)


def _runs(ordered: list[FileSpec], workers: int) -> list[list[FileSpec]]:
    """Contiguous runs of ``ordered``: about an equal share per worker, at most about ``_RUN_BYTES`` each.
    A run closes once it holds its share and either ``_RUN_FILES`` files (small files share frames) or
    ``_RUN_BYTES``: large files never queue up behind each other on one thread (a folder of shared libraries,
    nvidia's or torch's, is a row of them in pack order)."""
    total = sum(s.size + 4096 for s in ordered)
    limit = max(1, min(_RUN_BYTES, -(-total // workers)))
    runs: list[list[FileSpec]] = []
    run: list[FileSpec] = []
    size = 0
    for s in ordered:
        run.append(s)
        size += s.size + 4096
        if size >= limit and (len(run) >= _RUN_FILES or size >= _RUN_BYTES):
            runs.append(run)
            run, size = [], 0
    if run:
        runs.append(run)
    return runs


def _largest_first(runs: Sequence[list[FileSpec]]) -> list[int]:
    """The order the threads take ``runs`` in: the largest first (so the last to finish is a small one),
    pack order among equals."""
    return sorted(range(len(runs)), key=lambda i: -sum(s.size for s in runs[i]))


def stage(reader: ObjectReader, root: str | os.PathLike, specs: Sequence[FileSpec], tmp_name: TempName, *,
          progress: Callable[[int], None] | None = None, workers: int = WORKERS,
          folders: Callable[[str], None] | None = None) -> list[Staged]:
    """Write every spec under its temp name (see the module doc); returns them in pack order.
    ``progress(bytes_done)`` after each run. On any failure every temp file of the run is deleted.
    ``folders(path)``: makes the folder ``path`` when a create finds it missing (``restore --into``: the
    writers make the new tree's folders as they reach them, in parallel; its caller has checked every path
    with ``refuse_escapes``); without it, every folder must exist before."""
    root = os.fspath(root)
    ordered = sorted(specs, key=lambda s: pack_position(reader, s.chunks))
    if getattr(getattr(reader, "vault", None), "local", False):
        forked = _stage_forked(reader, root, ordered, tmp_name, progress, folders)
        if forked is not None:
            return forked
    runs = _runs(ordered, workers)
    take = _largest_first(runs)
    prefetch = getattr(reader, "prefetch", None)  # ObjectReader's: a bucket's packs, fetched ahead in this order
    if prefetch is not None:
        prefetch(c for i in take for s in runs[i] for c in s.chunks)
    failed = threading.Event()
    umask = current_umask()

    def run(part: list[FileSpec]) -> list[Staged]:
        out = []
        for spec in part:
            if failed.is_set():
                break
            try:
                out.append(_stage_one(reader, root, spec, tmp_name, umask, folders))
            except BaseException:
                failed.set()
                raise
        return out

    slots: list[list[Staged]] = [[] for _ in runs]
    done = 0
    threads = min(workers, len(runs))
    try:
        with busy_threads() if threads > 1 else nullcontext():
            results = _as_done(run, runs, threads, failed, take)
            try:
                for i, result in results:
                    slots[i] = result
                    done += sum(s.spec.size for s in result)
                    if progress:
                        progress(done)
            except BaseException:
                failed.set()  # the other threads stop at their next file
                raise
            finally:
                results.close()  # waits for the threads
    except BaseException:
        failed.set()
        for spec in ordered:
            _unlink(tmp_name(os.path.join(root, spec.path)))
        raise
    return [s for slot in slots for s in slot]


def _stage_forked(reader: ObjectReader, root: str, ordered: list[FileSpec], tmp_name: TempName,
                  progress: Callable[[int], None] | None, folders: Callable[[str], None] | None) -> list[Staged] | None:
    """The files written by forked processes (``default_write_processes``), each taking the next run, the
    largest first (``forked.map_all``), one thread each, and answering each file's sha256 and stats (a file
    under its final name: ``FINAL_NAME``) or its sha256 (under a temp name, renamed by the caller); None where
    that is not for this run (one process, too little to write, a process that already has threads, a crash
    test). A run a child did not answer (it failed, or was killed) is written again here, over what it left
    (``_fresh``); an error (a lying object) is raised here from that second try, and every file of the run
    (temp or final name) is deleted. ``progress`` as each run is written, by any process, and at the end."""
    from envvault.vault import forked
    from envvault.vault.threads import default_write_processes

    processes = default_write_processes()
    if processes < 2:
        return None
    runs = _runs(ordered, processes)
    weights = [sum(s.size + 4096 for s in run) for run in runs]
    if len(runs) < 2 or sum(weights) < _FORK_BYTES or not forked.can_fork():
        return None
    import pickle

    umask = current_umask()

    def write(run: list[FileSpec]) -> bytes:
        return pickle.dumps([(s.sha256, s.st) for s in (_stage_one(reader, root, spec, tmp_name, umask, folders)
                                                         for spec in run)])

    sizes = [sum(s.size for s in run) for run in runs]
    written = [0]

    def told(i: int) -> None:  # a run finished, in any process: the bar moves
        written[0] += sizes[i]
        progress(written[0])

    try:
        answers = forked.map_all(write, runs, weights, processes=processes, done=told if progress else None,
                                 bound=True)  # no writer outlives a restore killed with SIGKILL
        # ``tmp_name`` names a file alike in every process (its pid is the caller's, fixed before the fork).
        staged = [Staged(spec, tmp_name(final), final, sha, st) for run, got in zip(runs, answers, strict=True)
                  for spec, (sha, st) in zip(run, pickle.loads(got), strict=True)
                  for final in (os.path.join(root, spec.path),)]
        if progress:
            progress(sum(s.spec.size for s in staged))
    except BaseException:  # (the last progress call too: helper 33 found every temp file left after it raised)
        for spec in ordered:
            _unlink(tmp_name(os.path.join(root, spec.path)))
        raise
    return staged


_FORK_BYTES = 64 << 20  # below this much to write, the threads of one process (a fork costs milliseconds)


def _as_done(fn: Callable, items: Sequence, workers: int, failed: threading.Event,
             take: Sequence[int] | None = None) -> Iterator[tuple[int, object]]:
    """``fn(item)`` for each item on ``workers`` threads, taken in the order of the indexes ``take`` (default:
    the items' order); ``(index, result)`` yielded as each finishes, the first error raised as soon as it
    comes back. Closed before its end (an error here or in the caller), it sets ``failed`` (for ``fn`` to
    stop early) and waits for every thread; the threads take every item otherwise, whatever else sets
    ``failed``. Plain threads, not ``concurrent.futures``: its import (with ``logging``) is a tenth of a
    compile cache restore's start."""
    order = list(range(len(items))) if take is None else list(take)
    finished = False
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        if workers <= 1:
            for i in order:
                yield i, fn(items[i])
            finished = True
            return
        back: list[tuple[int, object, BaseException | None]] = []  # finished, not yet yielded
        ready = threading.Condition()
        taken = iter(order)
        lock = threading.Lock()

        def work() -> None:
            while not stop.is_set():
                with lock:
                    i = next(taken, None)
                if i is None:
                    return
                try:
                    got, err = fn(items[i]), None
                except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
                    got, err = None, exc
                with ready:
                    back.append((i, got, err))
                    ready.notify()

        threads = [threading.Thread(target=work, name=f"envvault-stage-{n}") for n in range(workers)]
        for t in threads:
            t.start()
        for _ in order:
            with ready:
                while not back:
                    ready.wait()
                i, got, err = back.pop(0)
            if err is not None:
                raise err
            yield i, got
        finished = True
    finally:
        if not finished:
            stop.set()  # the threads stop before their next item
            failed.set()
        for t in threads:
            if t.ident is not None:  # started (a thread that could not start is not waited for)
                t.join()


def _stage_one(reader: ObjectReader, root: str, spec: FileSpec, tmp_name: TempName, umask: int | None,
               folders: Callable[[str], None] | None = None) -> Staged:
    final = os.path.join(root, spec.path)
    tmp = tmp_name(final)
    try:
        if spec.link is not None:
            _fresh(lambda: os.symlink(spec.link, tmp), tmp, folders)
            crash_point("stage")
            return Staged(spec, tmp, final, None)
        on = timing.ON  # ENVVAULT_STAGES=1: each step's seconds summed (bench/); off, one check a step
        t0 = timing.clock() if on else 0.0
        mode = spec.mode & 0o777  # never setuid/setgid/sticky from a vault
        # Created with it where the umask leaves it whole (checked once written: a folder's default ACL
        # narrows it instead of the umask); else created private and given it once written.
        whole = umask is not None and not mode & umask
        fd = _fresh(lambda: os.open(tmp, _CREATE, mode if whole else 0o600), tmp, folders)
        h = hashlib.sha256()
        size = 0
        if on:
            t0 = _step("materialize: files made", t0)
        try:
            for item in ((spec.data,) if spec.data is not None else spec.chunks):
                data = item if spec.data is not None else reader.get(item)
                if on:
                    t0 = _step("materialize: objects read (decompressed, BLAKE3 checked)", t0)
                size += len(data)
                if size > spec.size:
                    break  # more than recorded: nothing past the recorded size is written
                h.update(data)
                if on:
                    t0 = _step("materialize: sha256", t0)
                while data:
                    n = os.write(fd, data)
                    data = data[n:]
                if on:
                    t0 = _step("materialize: writes", t0)
            if not whole:
                os.fchmod(fd, mode)
            st = os.fstat(fd) if whole or tmp == final else None
            if whole and st.st_mode & 0o777 != mode:  # a default ACL on the folder chose the bits, not the umask
                os.fchmod(fd, mode)
                st = os.fstat(fd)
            st = st if tmp == final else None  # no rename to come: these are its final stats
            if on:
                t0 = _step("materialize: modes, stats", t0)
        finally:
            os.close(fd)
            if on:
                _step("materialize: closes", t0)
    except OSError as err:
        raise storage_error(err, final) from None
    sha = record_sha256(h.digest())
    if size != spec.size or (spec.sha256 is not None and sha != spec.sha256):
        why = ("sha256 differs" if size == spec.size else f"{size} bytes, recorded {spec.size}" if size < spec.size
               else f"more than the {spec.size} bytes recorded")
        owner = f" ({spec.owner})" if spec.owner else ""
        raise CorruptError(f"{spec.path}{owner}: the vault's objects do not make the archived file ({why}); "
                           "nothing was renamed into place; run `envvault verify --read-data`")
    crash_point("stage")
    return Staged(spec, tmp, final, sha, st)


def _step(stage: str, since: float) -> float:
    """Add the seconds since ``since`` to ``stage`` (``timing``); the clock's reading now, for the next step."""
    timing.add(stage, since)
    return timing.clock()


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _fresh(create, tmp: str, folders: Callable[[str], None] | None = None):
    """``create()`` a new entry at ``tmp``; a stale one of that name (a killed run with this pid) is deleted
    first, never written through; a missing folder is made first by ``folders`` when given. (Trying first
    spares an ``unlink`` or a ``stat`` per file: temp names are almost always free, folders almost always
    there.)"""
    try:
        return create()
    except FileExistsError:
        _unlink(tmp)
        return create()
    except (FileNotFoundError, NotADirectoryError):
        if folders is None:
            raise
        folders(os.path.dirname(tmp))  # makes what is missing, or names what is in the way
        return _fresh(create, tmp)


def discard(staged: Iterable[Staged]) -> None:
    """Delete staged temp files (after a failure before any rename)."""
    for s in staged:
        _unlink(s.tmp)


# -- into place ------------------------------------------------------------------------------------


def place(s: Staged, *, keep_existing: bool = False) -> bool:
    """Rename ``s`` to its final path. Over whatever entry is there (an empty folder tree included:
    removed first; a non-empty one is an ``EnvironmentProblem``), or with ``keep_existing`` never over an entry
    that appeared meanwhile (``link`` + ``unlink``; a check and rename where the filesystem has no hard
    links). False: an entry was there and is left as found (the temp file is deleted)."""
    if keep_existing:
        return _place_new(s.tmp, s.final)
    try:
        os.rename(s.tmp, s.final)
    except IsADirectoryError:
        _rmdir_tree_if_empty(s.final)
        os.rename(s.tmp, s.final)
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST) and os.path.isdir(s.final) and not os.path.islink(s.final):
            raise _in_the_way(s.final) from None
        raise storage_error(err, s.final) from None
    return True


def _place_new(tmp: str, final: str) -> bool:
    try:
        os.link(tmp, final)
    except FileExistsError:
        _unlink(tmp)
        return False
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.ENOSYS):
            raise
        if os.path.lexists(final):  # no hard links here: check, then rename (a small window)
            _unlink(tmp)
            return False
        os.rename(tmp, final)
        return True
    _unlink(tmp)
    return True


def place_link(target: str, final: str, tmp_name: TempName, *, keep_existing: bool = False) -> bool:
    """Create the symlink ``final -> target``: replacing what is there (through a temp name), or with
    ``keep_existing`` only where nothing is (False: left as found)."""
    if keep_existing:
        try:
            os.symlink(target, final)
            return True
        except FileExistsError:
            return False
    tmp = tmp_name(final)
    os.symlink(target, tmp)
    os.replace(tmp, final)
    return True


def _rmdir_tree_if_empty(path: str) -> None:
    for root, _dirs, files in os.walk(path, topdown=False):
        if files:
            raise _in_the_way(path)
        os.rmdir(root)


def _in_the_way(path: str, error=EnvironmentProblem):
    return error(f"{path} is a non-empty directory where the snapshot has a file; move it and run again")


def refuse_folders_in_the_way(root: str | os.PathLike, paths, removable: Callable[[str], bool] | None = None
                              ) -> list[str]:
    """A RefusedError, before anything is written, when a file to write (``paths``, relative to ``root``) has in
    its place a folder holding a file: the commit would stop there, part done (``place`` removes only a tree
    of empty folders, never what a user keeps in one). A folder each of whose files (and links) the restore
    may delete (``removable(rel)``: another version of the package had a folder where this one has a file)
    is not refused: the paths of those folders are returned, for the commit to empty them first. One
    ``scandir`` a folder the paths lie in (a removed package's folders are not there: nothing is read under
    them), not one ``lstat`` a path (4 us each here: 47 ms of a torch restore's 11,680 files)."""
    by_folder: dict[str, list[str]] = {}
    for rel in paths:
        folder, _, name = rel.rpartition("/")
        by_folder.setdefault(folder, []).append(name)
    cleared: list[str] = []
    for folder, names in by_folder.items():
        where = os.path.join(root, folder) if folder else os.fspath(root)
        try:
            with os.scandir(where) as entries:
                folders = {e.name for e in entries if e.is_dir(follow_symlinks=False)}
        except OSError:
            continue  # no folder there (or a file): nothing in the way under it
        for name in names:
            if name not in folders:
                continue
            full = os.path.join(where, name)
            rel = f"{folder}/{name}" if folder else name
            held = False
            for inside in files_under(root, full):
                if removable is None or not removable(inside):
                    raise _in_the_way(full, RefusedError)
                held = True
            if held:
                cleared.append(rel)
    return cleared


def files_under(root: str | os.PathLike, folder: str) -> Iterator[str]:
    """Every file and link under ``folder`` (a link to a folder is not walked into), relative to ``root``."""
    for top, subdirs, names in os.walk(folder):
        inside = os.path.relpath(top, root).replace(os.sep, "/")
        for name in names + [d for d in subdirs if os.path.islink(os.path.join(top, d))]:
            yield f"{inside}/{name}"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

"""A first snap's small files read, hashed and packed in groups by forked processes, before the pipeline.

Most of the GPU host's 68,934 files are below 1 MiB (1.1 GB of its 7.6): each costs the ingest's one
storing thread and its readers some Python (open, read, two hashes, the hand-over, the manifest entry), all
under one interpreter lock, while the large files' bytes are hashed and compressed by threads that release
it. So a full scan (``scan.scan_environment``: every file to be read, the stat cache empty) whose RECORDs list
``MIN_BYTES`` or more of such files cuts them, in the order the scan reads them, into groups of at most
``GROUP_BYTES`` or ``GROUP_FILES`` (``small_groups``), and ``SmallGroups`` has them built by
``default_group_processes`` forked children (``forked.map_all``), or, where none is forked (one core or
``ENVVAULT_GROUP_PROCESSES=1``, another thread alive, not Linux), by the reader that first needs one: each group read file
by file (``Ingester.ingest``: sha256 for RECORD, BLAKE3 ids), its new objects packed by a pack writer of its
own and stored (``Vault.writer``: packs then index files, the writer's crash points), deduplicated against
the vault's index as it was before any group (frozen: no group's objects join it until all are built) and
within the group. So a group's packs are the same bytes whichever process builds it, and the vault's the same
whatever the process count. Then the groups' packs join the index in group order, and the scan's pipeline
takes each answered file's digest (``scan._planned``) where its ``lstat`` is the one the group saw; every
other file, and every file of a group that failed (a file that cannot be read: the pipeline reads it at its
own turn and says why), is read by the pipeline as before. An object in two groups lies in two packs
(docs/format.md, "Packs": a reader takes the first an index lists).
"""

from __future__ import annotations

import marshal
import os
import stat
import threading
from typing import Sequence

from envvault.errors import EnvironmentProblem
from envvault.model.identity import is_bytecode
from envvault.vault import timing
from envvault.vault.ingest import SMALL_FILE, FileDigest, Ingester
from envvault.vault.statcache import stat_key
from envvault.vault.store import Vault

from envvault.vault.forked import can_fork, map_all

__all__ = ["SmallGroups", "small_groups", "MIN_BYTES", "GROUP_BYTES", "GROUP_FILES"]

MIN_BYTES = 64 << 20  # small files' bytes (by RECORD) below which a scan builds no groups
GROUP_BYTES = 32 << 20  # a group's small files' bytes (by RECORD), at most ...
GROUP_FILES = 4096  # ... and its files


def small_groups(builder, dists: Sequence, digests: list | None = None) -> list[list[str]]:
    """The absolute paths of the files of ``dists`` that RECORD gives as non-empty and below ``SMALL_FILE``
    (bytecode, which a scan never reads, and paths outside the environment left out), in RECORD order, cut
    into groups; none when they add up to less than ``MIN_BYTES``. A path listed more than once (two
    distributions shipping one file, a RECORD naming it twice) is in no group: the pipeline reads it each time
    it is asked for, as without groups (whether a second ask comes depends on how far planning runs ahead,
    which depends on the reader threads). A rule of the environment, never of the cores: the groups, and so
    the packs, are the same on any host. ``digests``, when given, gets a list a group, each file's RECORD
    sha256 (or None) in the group's order: what a group checks a file linked out of the environment against
    before it stores a byte of it (``_build``)."""
    small: list[tuple[str, int, str | None]] = []
    seen: dict[str, int] = {}
    for dist in dists:
        for rec in dist.record or ():
            if not isinstance(rec.size, int) or not 0 < rec.size < SMALL_FILE or is_bytecode(rec.path):
                continue
            absolute = builder.absolute(dist, rec)
            if absolute is not None:
                small.append((absolute, rec.size, rec.digest if rec.algo == "sha256" else None))
                seen[absolute] = seen.get(absolute, 0) + 1
    groups: list[list[str]] = []
    sums: list[list[str | None]] = []
    group: list[str] = []
    gsums: list[str | None] = []
    size = total = 0
    for absolute, n, digest in small:
        if seen[absolute] > 1:
            continue
        if group and (size + n > GROUP_BYTES or len(group) >= GROUP_FILES):
            groups.append(group)
            sums.append(gsums)
            group, gsums, size = [], [], 0
        group.append(absolute)
        gsums.append(digest)
        size += n
        total += n
    if group:
        groups.append(group)
        sums.append(gsums)
    if digests is not None and total >= MIN_BYTES:
        digests.extend(sums)
    return groups if total >= MIN_BYTES else []


Key = list  # [st_size, st_mtime_ns, st_ino, st_ctime_ns]: the stat cache's key (statcache.stat_key)


class SmallGroups:
    """The groups of one full scan (``small_groups``) and what is known of their files. ``start`` builds them
    all at once in forked processes; a group not built by then (no fork: one process asked for, another
    thread alive, not Linux) is built by the first reader that asks for one of its files (``digest``), in this
    process, by the same function. ``finish`` adds every group's packs to the vault's index, in group order,
    and their bytes to ``writer``'s count, once the scan's reads are done: the main stream's deduplication
    never depends on when a group was built."""

    def __init__(self, vault: Vault, groups: list[list[str]], digests: list | None = None) -> None:
        self.vault = vault
        self.groups = groups
        # each group's files' RECORD sha256 (``small_groups``): what a link's bytes must be
        self.digests = digests if digests is not None else [[None] * len(g) for g in groups]
        self.where = {path: n for n, group in enumerate(groups) for path in group}  # each path once
        # What a group deduplicates against: the index as it was before any group, the same in every process.
        # Groups built at once (``start``) see the index itself, which nothing changes until they are all built;
        # groups built by the readers see a copy, since the pipeline's own packs join the index meanwhile.
        self.known = vault.index()
        # A group's answer: its bytes as built (compact) until a reader first asks for one of its files, then
        # decoded (``_open``) until each of its files was asked for once: the answers of tens of thousands of
        # files, decoded all at once, would hold tens of MB through the whole scan.
        self._built: list[bytes | None] = [None] * len(groups)
        self._answers: list[dict | None] = [None] * len(groups)
        self._left = [len(g) for g in groups]  # its files not yet asked for
        self._packs: list[tuple] = [((), 0, 0)] * len(groups)  # a group's (packs, bytes, objects)
        self._locks = [threading.Lock() for _ in groups]

    def start(self, processes: int) -> None:
        """Before the pipeline: build every group in ``processes`` forked processes (``forked.map_all``: this
        one only waits, and builds what a child did not); with one process, none here: each is built by the
        first reader that asks for one of its files."""
        if processes < 2 or not self.groups or not can_fork():  # no fork: each built by the first reader
            self.known = frozenset(self.known)
            return
        processes = min(processes, len(self.groups))  # no builder without a group to take
        t0 = timing.clock()
        known, vault = self.known, self.vault
        pids: list[int] = []

        groups, digests = self.groups, self.digests

        def build(n: int) -> bytes:
            return _build(vault, known, groups[n], digests[n])

        try:  # here=False: this process keeps no writer's heap; bound: a builder writes packs and holds the
            # vault's lock, so it must not outlive a snap killed with SIGKILL
            answers = map_all(build, range(len(groups)), [len(g) for g in groups],
                              processes=processes, here=False, pids=pids, bound=True)
        finally:  # a child killed mid-pack (Ctrl-C here, or the kernel) leaves its temp pack: removed now
            vault.state.clean_dead_tmp(pids)
        for n, got in enumerate(answers):
            self._take(n, got)
        if timing.ON:
            timing.add("scan: small files in groups (forked processes)", t0)

    def digest(self, path: str, key: Key) -> FileDigest | None:
        """The digest of ``path`` read by its group under stat key ``key``; None when it is in no group, was
        not read there (its group failed, it could not be read), or was read under other stats."""
        n = self.where.get(path)
        if n is None:
            return None
        with self._locks[n]:  # a reader builds or opens it; another that wants one of its files waits for it
            answers = self._answers[n]
            if answers is None:
                if self._built[n] is None:
                    t0 = timing.clock()
                    self._take(n, _build(self.vault, self.known, self.groups[n], self.digests[n]))
                    if timing.ON:
                        timing.add("readers: small files in groups (this process)", t0)
                answers = self._open(n)
            got = answers.pop(path, None)
            self._left[n] -= 1
            if self._left[n] <= 0:
                self._answers[n] = {}  # every file asked for: nothing more to hold
        return got[1] if got is not None and got[0] == key else None

    def _take(self, n: int, got: bytes) -> None:
        """Keep a group's answer as built (b"": it failed) and the packs it stored."""
        if got:
            _, packs, nbytes, objects = marshal.loads(got)
            self._packs[n] = (packs, nbytes, objects)
        self._built[n] = got

    def _open(self, n: int) -> dict:
        """A group's answer decoded: absolute path -> (stat key, digest); the bytes dropped."""
        answers: dict = {}
        got, self._built[n] = self._built[n], b""
        if got:
            done = marshal.loads(got)[0]
            group = self.groups[n]
            for i, key, sha, size, chunks in done:
                answers.setdefault(group[i], (key, FileDigest(sha, size, chunks)))
        self._answers[n] = answers
        return answers

    def finish(self, writer) -> None:
        """The groups' packs into the vault's index (group order) and their bytes into ``writer``'s count."""
        for packs, nbytes, objects in self._packs:
            self.vault.add_packs(packs)
            writer.count(nbytes, objects)


def _build(vault: Vault, known, group: list[str], digests: list | None = None) -> bytes:
    """One group read, hashed and packed (its packs stored, with their index files); the answer: the files
    read (position, stat key, sha256, size, chunk ids), the packs stored (``(pack_id, locations)``) and their
    bytes and objects, or b"" when the group failed (a store that failed: its files are left to the pipeline).
    A file that cannot be read is left out, for the pipeline to read at its turn and say why. A symlink (an
    installer's link into its cache: uv's ``--link-mode symlink``, pdm's) is read as the pipeline reads one,
    pinned (``Ingester.ingest``'s ``pin``): the file it leads to, of the stat key seen here, stored only when its
    bytes are exactly RECORD's (``digests``), else left out; its stat key is that file's, so the scan takes the
    answer only for the very file its plan found (``manifests._plan_linked_in``)."""
    packs: list = []
    writer = vault.writer(threads=1, on_commit=lambda pack_id, locs: packs.append((pack_id, locs)))
    ing = Ingester(writer, known.__contains__, threads=1)
    done = []
    t0 = timing.clock()
    try:
        for i, path in enumerate(group):
            try:
                st = os.lstat(path)
                pin = None
                if stat.S_ISLNK(st.st_mode) and digests is not None and digests[i] is not None:
                    st = os.stat(path)  # the file it leads to: read only while small, as the group's files are
                    if st.st_size >= SMALL_FILE:  # (RECORD said small: never a 1 TiB file read to find out)
                        continue
                    pin = (stat_key(st), digests[i])
                if not stat.S_ISREG(st.st_mode):
                    continue
                fd = ing.ingest(path, st.st_size, pin=pin)
                if pin is not None and (fd.chunks is None or fd.sha256 != pin[1] or fd.size != st.st_size):
                    continue  # not RECORD's bytes: nothing stored; the pipeline reads it and says what it is
            except (OSError, EnvironmentProblem):
                continue
            done.append((i, stat_key(st), fd.sha256, fd.size, fd.chunks))
        writer.flush()
        if timing.ON:  # in a child: "forked children: groups: ..." in this process's report
            timing.add("groups: a group read, hashed, packed", t0)
    except Exception:  # noqa: BLE001 - the group failed (a full disk, say): the pipeline reads its files
        writer.abort()
        return b""
    except BaseException:
        writer.abort()
        raise
    finally:
        writer.close()
    return marshal.dumps((done, packs, writer.written_bytes, writer.written_objects))

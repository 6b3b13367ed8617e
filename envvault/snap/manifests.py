"""One distribution's manifest (docs/format.md, "Distribution manifest"): every RECORD row checked against
the file on disk (hashed through the ``Ingester``, stat-cached), scripts normalised, installer-generated
rows told apart (``envvault.model.identity``), build, state and scripts ids; and the package summary a
snapshot lists for it."""

from __future__ import annotations

import os
import stat as statmod
from envvault.model.records import dataclass, field
from typing import TYPE_CHECKING

from envvault.env.probe import Interpreter
from envvault.errors import EnvironmentProblem
from envvault.model.identity import (
    IDENTITY_VERSION,
    LAUNCHER_HEAD,
    is_bytecode,
    is_generated,
    is_script,
    script_digest,
    scripts_id,
    state_id,
)
from envvault.model.manifest import FORMAT, DistManifest, FileEntry
from envvault.model.paths import link_target_problem, outward_links
from envvault.vault.fsutil import open_regular_fd
from envvault.vault.ingest import Ingester
from envvault.vault.statcache import StatCache, stat_key
from envvault.vault.store import Vault

if TYPE_CHECKING:
    from envvault.env.dists import InstalledDist

__all__ = ["ManifestBuilder", "summary_of", "DistPlan", "ReadRequest"]


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """A file a manifest entry waits for: read it (``absolute``, ``size``), then ``took``. A full scan plans
    tens of thousands of reads ahead of the pipeline, so a request holds little: the file's stat key
    (``statcache.stat_key``: its numbers the same objects the stat cache then keeps), not its
    ``os.stat_result`` (about 600 bytes of Python objects, its 19 fields), and its path relative to the
    environment's root (the manifest entry's own string) with that root, not a third string (GPU host, 49,405
    reads: 21.6 MB of stat results and 10 MB of paths alive at the scan's peak,
    ``bench/results/gpu_tracemalloc_snap_49b6f0a.txt``)."""

    base: str  # the environment's root, ending in "/"
    rel: str
    key: list  # [st_size, st_mtime_ns, st_ino, st_ctime_ns]
    entry: dict
    rec: object
    link: tuple | None = None  # a link out of the environment: (its target, the mode of the file it leads to)

    @property
    def pin(self) -> tuple | None:
        """What a link's file must be for its bytes to be stored (``Ingester.ingest``): the stat key it was
        planned with and RECORD's sha256; None for any other file."""
        return (self.key, self.rec.digest) if self.link is not None else None

    @property
    def absolute(self) -> str:
        return self.base + self.rel

    @property
    def size(self) -> int:
        return self.key[0]


@dataclass(frozen=True, slots=True)
class DistPlan:
    """One distribution's RECORD rows with their entries (None: left out), and the reads still to do."""

    dist: object
    rows: list
    reads: list
    warnings: list = field(default_factory=list)  # planning's, added to the builder's by ``finish``


# A python script bigger than this is hashed as it is (its shebang left in): none such is known.
_SCRIPT_READ_LIMIT = 16 << 20


class ManifestBuilder:
    """Builds the distribution manifests of one scan (``mode``: "full" hashes and stores, "check" hashes
    only, "lock" reads RECORD only), collecting its warnings."""

    def __init__(self, vault: Vault, interp: Interpreter, ingester: Ingester, cache: StatCache, mode: str):
        self.vault = vault
        self.interp = interp
        self.prefix = interp.prefix
        self._base = f"{str(interp.prefix).rstrip('/')}/"  # root "/" of a system environment: not "//"
        self.ing = ingester
        self.cache = cache
        self.mode = mode  # "full": hash and store; "check": hash only; "lock": RECORD only
        self.warnings: list[str] = []

    def file_entry(self, dist: InstalledDist, rec) -> dict | None:
        """One RECORD row's manifest entry, the file read on this thread when the stat cache misses."""
        entry, need = self.plan_entry(dist, rec)
        if need is not None:
            fd = self.ing.ingest(need.absolute, need.size, pin=need.pin)
            self.took(need, fd)
        return entry

    def absolute(self, dist: InstalledDist, rec) -> str | None:
        """Where a RECORD row's file lies, or None when that is outside the environment (never read)."""
        absolute = os.path.normpath(f"{dist.site}/{rec.path}")
        return absolute if absolute.startswith(self._base) else None

    def plan_entry(self, dist: InstalledDist, rec, warnings: list | None = None) -> tuple[dict | None, ReadRequest | None]:
        """One RECORD row's manifest entry, complete unless the file must be read: then the request to
        read it, which ``took`` completes the entry from."""
        absolute = self.absolute(dist, rec)
        if absolute is None:
            (self.warnings if warnings is None else warnings).append(
                f"{dist.display}: {rec.path} lies outside the environment; not stored")
            return None, None
        rel = absolute[len(self._base):]
        entry = {"path": rel, "record": rec.path}
        if rec.digest is not None:
            entry["sha256" if rec.algo == "sha256" else f"record_{rec.algo}"] = rec.digest
        if rec.size is not None:
            entry["size"] = rec.size
        if is_bytecode(rec.path):
            entry["state"] = "ok"
            return entry, None
        if self.mode == "lock":
            entry["state"] = "unchecked"
            return entry, None
        try:
            st = os.lstat(absolute)
        except (FileNotFoundError, NotADirectoryError):  # (a folder on its path is a file now: gone too)
            entry["state"] = "missing"
            return entry, None
        except OSError as err:
            raise EnvironmentProblem(f"cannot stat {absolute}: {err.strerror}") from None
        if statmod.S_ISDIR(st.st_mode):
            if rec.digest is None and rec.size is None:
                return None, None  # virtualenv's seeder lists folders (``pip/__pycache__,,``); finish() reports them
            entry["state"] = "missing"  # a file RECORD hashes, a folder now: the file is gone
            return entry, None
        if not (statmod.S_ISREG(st.st_mode) or statmod.S_ISLNK(st.st_mode)):
            # A FIFO, socket or device where RECORD has a file (never opened: it could block): the file is
            # gone, and a restore puts it back (helper 29: every command stopped, a restore could not repair it).
            entry["state"] = "missing"
            return entry, None
        entry["mode"] = st.st_mode & 0o7777
        if statmod.S_ISLNK(st.st_mode):
            link = os.readlink(absolute)
            if rec.algo == "sha256" and rec.digest is not None and link_target_problem(rel, link) is not None:
                planned = self._plan_linked_in(entry, rec, rel, absolute, link)
                if planned is not None:
                    return planned
            entry["link"] = link
            followed = _link_state(entry, absolute, rec)
            if followed is not None:  # the stats of the file it leads to: what the stat cache group checks
                self.cache.put_key(rel, stat_key(followed[0]), followed[1], None)
            else:
                self.cache.forget(rel)  # no group then (``scan.remember_group``)
            return entry, None
        hit = self.cache.lookup(rel, st)
        if hit is not None and (self.mode == "check" or hit[2] is not None):
            self._complete(entry, rec, st.st_size, hit[1], hit[2])
            return entry, None
        return entry, ReadRequest(self._base, rel, stat_key(st), entry, rec)

    def _plan_linked_in(self, entry: dict, rec, rel: str, absolute: str, link: str) -> tuple[dict, ReadRequest | None] | None:
        """A RECORD row that is a symlink leading out of the environment to a regular file of RECORD's size (an
        installer that links files from its cache: uv's ``--link-mode symlink``): the read that completes its
        entry takes only the file of the stat key seen here and stores its bytes only when they are exactly
        RECORD's (``ReadRequest.pin``); then ``took`` makes the entry that file (its bytes and mode, no link:
        docs/format.md, "Distribution manifest"), so a restore brings it back once the cache is pruned, else a
        link whose bytes are not stored, as they may be anyone's. Its stat key is the file's it leads to, as a
        link's is. None for any other link (recorded as a link, ``_link_state``)."""
        try:
            fd = open_regular_fd(absolute)  # the link followed; a FIFO or a device is not opened
        except OSError:
            return None
        if fd is None:
            return None
        try:
            opened = os.fstat(fd)
        finally:
            os.close(fd)
        if rec.size is not None and rec.size != opened.st_size:
            return None
        hit = self.cache.lookup(rel, opened)
        if hit is not None and hit[1] == rec.digest and (self.mode == "check" or hit[2] is not None):
            entry["mode"] = opened.st_mode & 0o7777
            self._complete(entry, rec, opened.st_size, hit[1], hit[2])
            return entry, None
        return entry, ReadRequest(self._base, rel, stat_key(opened), entry, rec, (link, opened.st_mode & 0o7777))

    def took(self, need: ReadRequest, fd) -> None:
        """Complete the entry of a file read for ``need`` (``fd``: the ingester's FileDigest). A link's
        (``need.link``) is the file it leads to when its bytes were RECORD's (and stored, in a full scan), else
        a ``modified`` link, as ``_link_state`` makes it."""
        if need.link is not None:
            if fd.sha256 != need.rec.digest or fd.size != need.size or (self.mode == "full" and fd.chunks is None):
                self.cache.put_key(need.rel, need.key, fd.sha256, None)
                need.entry.update(link=need.link[0], state="modified", sha256=fd.sha256,
                                  record_sha256=need.rec.digest)
                return
            need.entry["mode"] = need.link[1]
        self.cache.put_key(need.rel, need.key, fd.sha256, fd.chunks)
        self._complete(need.entry, need.rec, need.size, fd.sha256, fd.chunks)

    def _complete(self, entry: dict, rec, size: int, sha: str, chunks) -> None:
        if self.mode == "full":
            entry["chunks"] = chunks
        entry["size"] = size
        if rec.algo == "sha256" and rec.digest is not None:
            if sha != rec.digest:
                entry["state"] = "modified"
                entry["record_sha256"] = rec.digest
                entry["sha256"] = sha
            else:
                entry["state"] = "ok"
        else:
            entry["state"] = "unhashed"
            entry["sha256"] = sha

    def plan(self, dist: InstalledDist) -> DistPlan:
        """Every RECORD row's entry, with the reads still to do (``ReadRequest``s, each completed by
        ``took``); ``finish`` then builds the manifest."""
        rows, reads, warnings = [], [], []
        for rec in dist.record or ():
            entry, need = self.plan_entry(dist, rec, warnings)
            rows.append((rec, entry))
            if need is not None:
                reads.append(need)
        return DistPlan(dist, rows, reads, warnings)

    def manifest(self, dist: InstalledDist) -> DistManifest:
        """The manifest of ``dist``, its files read on this thread."""
        plan = self.plan(dist)
        for need in plan.reads:
            self.took(need, self.ing.ingest(need.absolute, need.size, pin=need.pin))
        return self.finish(plan)

    def finish(self, plan: DistPlan) -> DistManifest:
        """The manifest of a plan whose reads are all done: each entry's gathered keys become its record
        (keys a scan did not learn stay out of the document)."""
        dist = plan.dist
        self.warnings.extend(plan.warnings)
        files: list[FileEntry] = []
        modified = []
        layout = dist.layout(self.interp.scripts)
        folders, unhashed, scripts = [], [], []
        scripts_known = self.mode != "lock"
        for rec, kw in plan.rows:
            if kw is None:
                if os.path.isdir(os.path.normpath(f"{dist.site}/{rec.path}")):
                    folders.append(rec.path)
                continue
            if kw["state"] == "modified":
                modified.append((kw["path"], kw["sha256"]))
            in_scripts = is_script(rec.path, layout)
            generated = is_generated(rec, layout)
            script = in_scripts and not generated
            digest = None
            if script and self.mode != "lock":
                digest = self._script(kw, layout, rec)
                if digest == "":
                    generated = True  # a launcher by its content
                elif digest is None:
                    scripts_known = False  # an edited or missing script: its build cannot be told
                elif digest:
                    scripts.append((os.path.basename(rec.path), digest))
            if generated and in_scripts:
                kw["generated"] = True  # a launcher: named in entry_points.txt, or by content
            files.append(FileEntry.scanned(kw))  # kw is complete: the record writes it back as it is
            if rec.algo is None and not generated and (digest or not script):  # launchers are the installer's
                unhashed.append(rec.path)
        if dist.hashless and self.mode != "lock":  # pdm's linked rows: RECORD vouches for none of their bytes,
            # the state id does (a lock-only scan reads no file: its state id is the build id, as for any other)
            named = {path for path, _sha in modified}
            modified += [(f.path, f.sha256 or _text_sha(f.link or "")) for f in files
                         if f.record in dist.hashless and f.path not in named and f.state != "missing"
                         and not is_bytecode(f.record)]
        self._report_rows(dist, folders, unhashed, [f.record for f in files if f.state == "missing"])
        self._report_outward(dist, files)
        build = dist.build_id(self.interp.scripts)
        from envvault.env.dists import build_info  # email, packaging: the fast path never needs them

        return DistManifest(
            kind="dist",
            format=FORMAT,
            name=dist.name,
            version=dist.version,
            dist_info=dist.dist_info.relative_to(self.prefix).as_posix(),
            installer=dist.installer,
            requested=dist.requested,
            wheel=dist.wheel,
            direct_url=dist.direct_url,
            record="ok" if dist.record is not None else "missing",
            build_id=build,
            state_id=state_id(build, modified),
            scripts=scripts_id(scripts) if scripts_known else None,
            build_info=build_info(dist),
            files=tuple(files),
        )

    def _script(self, kw: dict, layout, rec) -> str | None:
        """The normalised digest of a script in the scripts folder (``kw``: its entry's keys, not yet a
        record); "" for a launcher the installer wrote (generated, by its content); None when the script is
        edited or missing."""
        if kw["state"] not in ("ok", "unhashed") or "link" in kw:
            return None
        absolute = f"{self._base}{kw['path']}"
        try:
            fd = open_regular_fd(absolute)  # read and hashed a moment ago; a FIFO swapped in since is not waited on
            if fd is None:
                return None
            with os.fdopen(fd, "rb") as fh:
                head = fh.read(LAUNCHER_HEAD)
                if is_generated(rec, layout, head):
                    return ""
                if not head.startswith(b"#!") or (kw.get("size") or 0) > _SCRIPT_READ_LIMIT:
                    return kw.get("sha256")
                return script_digest(head + fh.read())
        except OSError:
            return None

    def _report_rows(self, dist: InstalledDist, folders: list[str], unhashed: list[str], missing: list[str]) -> None:
        """One warning per kind of RECORD row that does not describe a file as it should."""
        for rows, what in (
            (folders, "names folders, not files (left out)"),
            (unhashed, "gives no hash (stored as found)"),
            (missing, "lists files that are gone (recorded as missing)"),
        ):
            if rows:
                shown = ", ".join(sorted(rows)[:3]) + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")
                self.warnings.append(f"{dist.display}: RECORD {what}: {shown}")

    def _report_outward(self, dist: InstalledDist, files: list[FileEntry]) -> None:
        """One warning for the files of ``dist`` recorded as symlinks that lead out of the environment: links to
        anything but a file holding RECORD's bytes (those are stored as files, ``_plan_linked_in``), such as a
        file a user replaced by a link. A restore never creates a link out of its target (docs/format.md,
        "Threat model") and refuses them; helper 29 found it out only when a rollback failed."""
        out = outward_links((f.path, f.link) for f in files)
        if out:
            shown = ", ".join(sorted(out)[:2]) + (f" and {len(out) - 2} more" if len(out) > 2 else "")
            self.warnings.append(f"{dist.display}: {len(out)} file(s) are symlinks that lead out of the environment "
                                 f"and not to the package's bytes (gone, or other bytes: {shown}); a restore will refuse to make "
                                 "them: reinstall the package, or restore a snapshot that holds its files")


def _link_state(entry: dict, absolute: str, rec) -> tuple[list, str] | None:
    """The state of a RECORD row that is a symlink on disk (docs/format.md, "Distribution manifest"): RECORD
    promises a file's bytes, so a row with a sha256 is ``ok`` only while the link leads to a regular file
    holding exactly them; else ``modified``, its ``sha256`` that file's bytes' or, when the link leads to no
    regular file (dangling, a folder, a FIFO: never waited on), to one of another size than RECORD's (never
    read: it may be of any size) or to one that cannot be read (a ``/sys`` file), its own text's. Returns the
    stat of the file read through the link (as opened) and its bytes' sha256, or None when none was read. A
    row without a sha256 is ``ok`` while the link leads to a
    regular file of RECORD's size (a ``stat``, nothing read), else ``modified``, its ``sha256`` the link's own
    text's (pdm's links into a cache that was pruned or changed, once the cached RECORD that gave their
    hashes is gone too)."""
    import hashlib

    from envvault.model.record import record_sha256

    if rec.algo != "sha256" or rec.digest is None:
        try:
            st = os.stat(absolute)  # (followed; nothing opened)
            there = statmod.S_ISREG(st.st_mode) and (rec.size is None or rec.size == st.st_size)
        except (OSError, ValueError):
            there = False
        if there:
            entry["state"] = "ok"
        else:
            entry.update(state="modified", sha256=_text_sha(entry["link"]))
        return None

    sha, exact, opened = None, False, None
    try:
        fd = open_regular_fd(absolute)  # the link followed; a FIFO or a device is not read
    except OSError:
        fd = None
    if fd is not None:
        with os.fdopen(fd, "rb") as fh:
            opened = os.fstat(fd)
            left = opened.st_size  # as large as it was when opened: a file still growing is not followed
            if rec.size is None or rec.size == left:
                h = hashlib.sha256()
                try:
                    while left > 0 and (piece := fh.read(min(left, 1 << 20))):
                        h.update(piece)
                        left -= len(piece)
                    exact = left == 0 and not fh.read(1)  # no more than it says (a ``/proc`` file says size 0)
                    sha = record_sha256(h.digest())
                except OSError:
                    sha = None
    if sha is None:
        opened = None
        sha = _text_sha(entry["link"])
    if exact and sha == rec.digest:
        entry["state"] = "ok"
    else:
        entry.update(state="modified", sha256=sha, record_sha256=rec.digest)
    return (opened, sha) if opened is not None else None


def _text_sha(text: str) -> str:
    """The RECORD-style sha256 of a link's own text (what a link is recorded by when no file's bytes are)."""
    import hashlib

    from envvault.model.record import record_sha256

    return record_sha256(hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest())


def summary_of(man: DistManifest, oid: str) -> dict:
    """The package summary a snapshot lists for manifest ``man`` stored as ``oid``."""
    files = man.files
    counted = [f for f in files if f.state != "missing" and not is_bytecode(f.record)]
    return {
        "name": man.name,
        "version": man.version,
        "build_id": man.build_id,
        "state_id": man.state_id,
        "identity": IDENTITY_VERSION,
        "scripts": man.scripts,
        "manifest": oid,
        "installer": man.installer,
        "requested": man.requested,
        "record": man.record,
        "build_info": man.build_info,
        "files": len(counted),
        "size": sum(f.size or 0 for f in counted),
        "modified": sorted(f.path for f in files if f.state == "modified"),
        "missing": sorted(f.path for f in files if f.state == "missing"),
        "exec": _exec_files(counted),
    }


def _exec_files(files: list[FileEntry]) -> list[str] | None:
    """Paths of the files with an execute bit (docs/format.md, "exec"); None when no mode was recorded."""
    if not any(f.mode is not None for f in files):
        return None
    return sorted(f.path for f in files if f.link is None and not f.generated and (f.mode or 0) & 0o111)

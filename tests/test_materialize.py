"""The one materializer (envvault/materialize.py) and the restore journal record (envvault/model/journal.py),
in process: staging in pack order with size and sha256 checks, what a failure leaves (nothing), placing with
and without overwriting, the final-tree refusal; the journal's parser, its problems and its exact bytes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import pytest

from envvault import materialize
from envvault.errors import CorruptError, RefusedError
from envvault.materialize import FileSpec
from envvault.model.journal import Journal, parse_journal
from envvault.model.record import record_sha256


class _Reader:
    """The two things the materializer asks of an ObjectReader: ``locate`` (pack positions) and ``get``."""

    def __init__(self, blobs: dict[str, bytes]):
        self.blobs = blobs
        self.index = {oid: (f"pack{i % 3}", i, 0, i, len(b), "b") for i, (oid, b) in enumerate(blobs.items())}

    def get(self, oid: str) -> memoryview:
        return memoryview(self.blobs[oid])

    def locate(self, oid: str, refresh: bool = True) -> tuple | None:
        return self.index.get(oid)


def _spec(path: str, data: bytes, oid: str, **kw) -> FileSpec:
    return FileSpec(path, (oid,), len(data), record_sha256(hashlib.sha256(data).digest()), 0o755, **kw)


def _tmp(final: str) -> str:
    head, name = os.path.split(final)
    return os.path.join(head, f".{name}.test.tmp")


def _files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_stage_then_place_writes_every_file_checked(tmp_path):
    blobs = {f"o{i}": f"data {i}".encode() * (i + 1) for i in range(40)}
    specs = [_spec(f"f{i}", data, oid) for i, (oid, data) in enumerate(blobs.items())]
    seen: list[int] = []
    staged = materialize.stage(_Reader(blobs), tmp_path, specs, _tmp, progress=seen.append, workers=3)
    assert sorted(s.spec.path for s in staged) == sorted(s.path for s in specs)
    assert seen and seen[-1] == sum(s.size for s in specs)
    assert _files(tmp_path) == sorted(f".f{i}.test.tmp" for i in range(40))  # nothing under a final name yet
    for s in staged:
        assert materialize.place(s)
    assert _files(tmp_path) == sorted(f"f{i}" for i in range(40))
    assert (tmp_path / "f3").read_bytes() == blobs["o3"] and (tmp_path / "f3").stat().st_mode & 0o777 == 0o755


def test_stages_timed_write_the_same_files(tmp_path, monkeypatch):
    """With ``ENVVAULT_STAGES=1`` (``timing.ON``) each file's steps are timed (bench/gpu_into_stages.sh reads
    them) and the files staged are the same, checked the same: a lying sha256 still stages nothing."""
    from envvault.vault import timing

    monkeypatch.setattr(timing, "ON", True)
    monkeypatch.setattr(timing, "_totals", {})
    blobs = {f"o{i}": f"data {i}".encode() * (i + 1) for i in range(12)}
    specs = [_spec(f"f{i}", data, oid) for i, (oid, data) in enumerate(blobs.items())]
    (tmp_path / "a").mkdir()
    staged = materialize.stage(_Reader(blobs), tmp_path / "a", specs, _tmp, workers=2)
    for s in staged:
        assert materialize.place(s)
    assert {p: (tmp_path / "a" / p).read_bytes() for p in _files(tmp_path / "a")} == {f"f{i}": blobs[f"o{i}"] for i in range(12)}
    steps = {k: v[1] for k, v in timing._totals.items() if k.startswith("materialize: ")}
    assert set(steps) == {"materialize: files made", "materialize: objects read (decompressed, BLAKE3 checked)",
                          "materialize: sha256", "materialize: writes", "materialize: modes, stats",
                          "materialize: closes"}
    assert steps["materialize: writes"] == steps["materialize: files made"] == steps["materialize: closes"] == 12, steps
    specs[5] = FileSpec("f5", ("o5",), len(blobs["o5"]), record_sha256(hashlib.sha256(b"other").digest()), 0o644)
    (tmp_path / "b").mkdir()
    with pytest.raises(CorruptError, match="f5: the vault's objects do not make the archived file"):
        materialize.stage(_Reader(blobs), tmp_path / "b", specs, _tmp, workers=2)
    assert _files(tmp_path / "b") == []


def test_a_lying_object_stages_nothing(tmp_path):
    blobs = {f"o{i}": b"x" * i for i in range(1, 30)}
    specs = [_spec(f"f{i}", blobs[f"o{i}"], f"o{i}", owner="pkg 1.0") for i in range(1, 30)]
    specs[20] = FileSpec("f21", ("o21",), 21, record_sha256(hashlib.sha256(b"other").digest()), 0o644, owner="pkg 1.0")
    with pytest.raises(CorruptError, match=r"f21 \(pkg 1.0\): the vault's objects do not make the archived file"):
        materialize.stage(_Reader(blobs), tmp_path, specs, _tmp, workers=2)
    assert _files(tmp_path) == []  # every temp file of the run is gone


def test_runs_come_back_as_done_taken_in_the_order_given_and_the_first_error_stops_them():
    import threading
    import time

    before = threading.active_count()

    def slow_first(n: int) -> int:
        time.sleep(0.05 if n == 0 else 0)  # the first item finishes last
        return n * n

    got = list(materialize._as_done(slow_first, list(range(20)), 4, threading.Event()))
    assert sorted(got) == [(n, n * n) for n in range(20)] and got[-1] == (0, 0)  # as done, not in order
    assert threading.active_count() == before  # every thread joined
    take = [3, 1, 4, 0, 2]
    assert [i for i, _ in materialize._as_done(lambda n: n, list(range(5)), 1, threading.Event(), take)] == take

    seen: list[int] = []
    failed = threading.Event()

    def fails_at_5(n: int) -> int:
        seen.append(n)
        if n == 5:
            raise OSError("disk full")
        time.sleep(0.01)
        return n

    with pytest.raises(OSError, match="disk full"):
        for _ in materialize._as_done(fails_at_5, list(range(200)), 3, failed):
            pass
    assert failed.is_set() and threading.active_count() == before
    assert len(seen) < 200  # the threads stopped taking items

    for workers in (1, 3):  # closed early by the caller: ``failed`` set, every thread joined
        failed = threading.Event()
        gen = materialize._as_done(lambda n: n, list(range(50)), workers, failed)
        assert next(gen)[0] in range(50)
        gen.close()
        assert failed.is_set() and threading.active_count() == before

    failed = threading.Event()  # set by something else, with no error: every item still comes back
    failed.set()
    assert sorted(materialize._as_done(lambda n: n, list(range(30)), 3, failed)) == [(n, n) for n in range(30)]


def test_large_files_get_runs_of_their_own_taken_first(tmp_path):
    """A row of large files in pack order (a folder of shared libraries) is not one thread's run: a run
    closes at ``_RUN_BYTES`` whatever its file count, small files still share runs, the largest run is taken
    first, and ``stage`` returns every file in pack order whatever order the runs finished in."""
    big, mid = 3 * materialize._RUN_BYTES, 2 << 20
    sizes = [10] * 40 + [big] * 5 + [mid] * 40
    specs = [FileSpec(f"f{i:03}", (f"o{i}",), n) for i, n in enumerate(sizes)]
    runs = materialize._runs(specs, workers=16)
    larges = [sum(s.size == big for s in r) for r in runs]
    assert larges.count(1) == 5 and max(larges) == 1  # no two large files in one run (one closes a run)
    assert [s for r in runs for s in r] == specs
    assert all(len(r) >= materialize._RUN_FILES or sum(s.size for s in r) >= materialize._RUN_BYTES
               for r in runs[:-1])  # a run closes at 16 files or 16 MiB, never below its share
    assert [len(r) for r in runs if r[0].size == mid] == [8] * 5  # 16 MiB of 2 MiB files: 8 a run
    take = materialize._largest_first(runs)
    assert [larges[i] for i in take[:5]] == [1] * 5 and sorted(take) == list(range(len(runs)))
    assert take[5:] == sorted(take[5:])  # pack order among the rest (equal sizes)

    blobs = {f"o{i}": bytes([i % 251]) * (i * 997 % 5000 + 1) for i in range(60)}
    specs = [_spec(f"g{i:02}", data, oid) for i, (oid, data) in enumerate(blobs.items())]
    reader = _Reader(blobs)
    staged = materialize.stage(reader, tmp_path, specs, _tmp, workers=4)
    ordered = sorted(specs, key=lambda s: materialize.pack_position(reader, s.chunks))
    assert [s.spec for s in staged] == ordered


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
def test_modes_come_whole_under_any_umask_with_no_fchmod_where_it_leaves_them(tmp_path, monkeypatch, umask):
    """Each file ends with its archived mode less setuid, setgid and sticky, whatever the umask: created with
    it where the umask leaves it whole (no fchmod), else created private and given it after writing."""
    from envvault.vault.fsutil import current_umask

    modes = [0o644, 0o755, 0o600, 0o777, 0o444, 0o4755, 0o2750, 0o1777]
    blobs = {f"o{i}": b"m" * (i + 1) for i in range(len(modes))}
    specs = [FileSpec(f"m{i}", (f"o{i}",), i + 1, record_sha256(hashlib.sha256(blobs[f"o{i}"]).digest()), m)
             for i, m in enumerate(modes)]
    chmods: list[int] = []
    fchmod = os.fchmod
    monkeypatch.setattr(materialize.os, "fchmod", lambda fd, mode: chmods.append(mode) or fchmod(fd, mode))
    old = os.umask(umask)
    try:
        assert current_umask() == umask
        staged = materialize.stage(_Reader(blobs), tmp_path, specs, materialize.FINAL_NAME, workers=2)
    finally:
        os.umask(old)
    assert {s.spec.path: s.st.st_mode & 0o7777 for s in staged} == {f"m{i}": m & 0o777 for i, m in enumerate(modes)}
    assert {f"m{i}": (tmp_path / f"m{i}").stat().st_mode & 0o7777 for i in range(len(modes))} == \
        {f"m{i}": m & 0o777 for i, m in enumerate(modes)}
    assert sorted(chmods) == sorted(m & 0o777 for m in modes if m & 0o777 & umask)


def test_a_folders_default_acl_does_not_narrow_the_archived_mode(tmp_path):
    """Where a folder has a default ACL, the kernel gives a new file the ACL's bits (within the mode asked
    for) instead of applying the umask: a file created with its mode is checked once written and given the
    archived mode, as one created private always was."""
    import struct
    import tempfile

    entry = struct.Struct("<HHI")  # the kernel's posix_acl xattr: version 2, then (tag, perm, id) entries
    acl = struct.pack("<I", 2) + b"".join(entry.pack(tag, perm, 0xFFFFFFFF) for tag, perm in
                                           ((0x01, 7), (0x04, 5), (0x20, 0)))  # u::rwx g::r-x o::---
    errors = []
    for base in (tmp_path, Path("/dev/shm")):  # ext4 mounted with acl, else Linux's tmpfs
        root = Path(tempfile.mkdtemp(dir=base))
        folder = root / "acl"
        folder.mkdir()
        try:
            os.setxattr(folder, "system.posix_acl_default", acl)
            break
        except OSError as err:
            errors.append(f"{base}: {err}")
            shutil.rmtree(root)
    else:
        raise AssertionError(f"no folder here keeps a POSIX ACL: {errors}")
    probe = folder / "probe"
    probe.touch(0o755)
    assert probe.stat().st_mode & 0o777 == 0o750  # the ACL, not the umask, chose the bits
    data = b"#!/bin/sh\n"
    specs = [FileSpec("acl/tool", ("t",), len(data), record_sha256(hashlib.sha256(data).digest()), 0o755)]
    old = os.umask(0o022)
    try:
        staged = materialize.stage(_Reader({"t": data}), root, specs, materialize.FINAL_NAME, workers=1)
    finally:
        os.umask(old)
    try:
        assert (folder / "tool").stat().st_mode & 0o777 == 0o755 and staged[0].st.st_mode & 0o777 == 0o755
    finally:
        shutil.rmtree(root)


def test_a_short_file_is_refused(tmp_path):
    blobs = {"o": b"abc"}
    spec = FileSpec("f", ("o",), 4, None, 0o644)
    with pytest.raises(CorruptError, match="3 bytes, recorded 4"):
        materialize.stage(_Reader(blobs), tmp_path, [spec], _tmp)
    assert _files(tmp_path) == []


def test_keep_existing_never_overwrites(tmp_path):
    blobs = {"o": b"new"}
    (staged,) = materialize.stage(_Reader(blobs), tmp_path, [_spec("f", b"new", "o")], _tmp)
    (tmp_path / "f").write_bytes(b"appeared meanwhile")
    assert materialize.place(staged, keep_existing=True) is False
    assert (tmp_path / "f").read_bytes() == b"appeared meanwhile" and _files(tmp_path) == ["f"]


def test_symlinks_are_staged_and_placed(tmp_path):
    (staged,) = materialize.stage(_Reader({}), tmp_path, [FileSpec("l", link="target")], _tmp)
    materialize.place(staged)
    assert os.readlink(tmp_path / "l") == "target"
    assert materialize.place_link("t2", str(tmp_path / "l"), _tmp) and os.readlink(tmp_path / "l") == "t2"
    assert materialize.place_link("t3", str(tmp_path / "l"), _tmp, keep_existing=True) is False


def test_refuse_escapes_names_each_entry(tmp_path):
    with pytest.raises(RefusedError, match=r"refusing to restore X: up/f: lies under up, a symlink this restore creates; up: is a symlink that leads out"):
        materialize.refuse_escapes(tmp_path, "refusing to restore X", links={"up": "../.."}, entries=["up/f"])
    materialize.refuse_escapes(tmp_path, "refusing", links={"ok": "a/b"}, entries=["a/b"])


def test_an_entry_under_nested_links_names_the_topmost_and_folders_above_entries_count_as_made(tmp_path):
    """The final tree's rule, as it was before its loops were made cheaper: the topmost symlink of the
    restore above an entry is the one named; a folder above any entry, link or folder of the restore is one
    the restore makes (an entry below it is inside), however many entries share it."""
    from envvault.safepaths import FinalTree

    tree = FinalTree(tmp_path, links={"a": "x", "a/b": "y"}, entries=["a/b/c/f", "d/e/g", "d/e/h", "d/k"])
    assert tree.write_problem("a/b/c/f") == "lies under a, a symlink this restore creates"
    assert tree.write_problem("d/e/g") is None and tree._implied == {"a", "a/b", "a/b/c", "d", "d/e"}
    assert tree._kind("d/e") == ("dir", None) and tree._kind("a/b/c") == ("dir", None)
    assert tree._kind("q") == ("missing", None)


def test_path_problem_says_what_splitting_the_path_says():
    """``path_problem`` finds empty and "." parts without splitting into them: the same answer as the
    definition (each part of ``path.split("/")``) on every path of up to four pieces of a tricky alphabet."""
    import itertools

    from envvault.model import paths

    def defined(path):
        why = paths._text_problem(path)
        if why is not None:
            return why
        parts = path.split("/")
        if ".." in parts:
            return "contains '..'"
        if any(p in ("", ".") for p in parts):
            return "is not a normalised path"
        return None

    pieces = ["a", ".", "..", "", "/", "b.c", "...", ".a", "a."]
    for k in range(1, 5):
        for combo in itertools.product(pieces, repeat=k):
            for path in ("".join(combo), "/".join(combo)):
                assert paths.path_problem(path) == defined(path), path


# -- the journal record ----------------------------------------------------------------------------


def _journal_doc() -> dict:
    return {"format": 1, "snapshot": "ab" * 32, "backup": None, "pid": 41, "started": "2026-11-30T21:00:00Z",
            "staging_dirs": ["", "lib/python3.11/site-packages/pkg"], "removals": ["bin/old"],
            "writes": ["lib/python3.11/site-packages/pkg/__init__.py"],
            "dist_infos": ["lib/python3.11/site-packages/pkg-1.0.dist-info"], "protected": [".", "bin"]}


def test_journal_round_trips_byte_for_byte():
    doc = _journal_doc()
    journal = parse_journal(doc)
    assert journal.pid == 41 and journal.writes == ("lib/python3.11/site-packages/pkg/__init__.py",)
    # the bytes the restore has always written: the format's key order, compact separators
    assert json.dumps(journal.to_dict(), separators=(",", ":")) == json.dumps(doc, separators=(",", ":"))


def test_journal_parser_names_every_problem():
    doc = {**_journal_doc(), "pid": "41", "removals": ["ok", 3, "a\x00b"], "writes": {}, "format": 2}
    with pytest.raises(CorruptError) as err:
        parse_journal(doc, "J")
    text = str(err.value)
    for part in ("format: 2 is newer", "pid: expected an integer", "removals[1]: expected a string",
                 "removals[2]: expected a string", "writes: expected a list"):
        assert part in text, text


def test_a_damaged_journal_is_salvaged():
    salvaged = Journal.salvage({**_journal_doc(), "removals": ["ok", 3], "writes": "x", "snapshot": 5})
    assert salvaged.removals == ("ok",) and salvaged.writes == () and salvaged.snapshot is None
    assert salvaged.staging_dirs == ("", "lib/python3.11/site-packages/pkg")
    assert Journal.salvage([1, 2]) == Journal(snapshot=None)



def test_busy_threads_shortens_the_switch_interval_and_stops_collection_then_puts_both_back(tmp_path):
    """``busy_threads`` (the ingest pipeline's and the materializer's threads): a switch interval of at most
    ``SWITCH_INTERVAL`` and no cyclic collection inside, both as they were after, an error or not; a shorter
    interval already set is kept. The materializer runs its writers under it, and only then."""
    import gc
    import sys

    from envvault.vault import threads

    seen = []
    old = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        with pytest.raises(KeyError):
            with threads.busy_threads():
                seen.append((sys.getswitchinterval(), gc.isenabled()))
                raise KeyError("x")
        assert (sys.getswitchinterval(), gc.isenabled()) == (pytest.approx(0.005, rel=0.05), True)
        sys.setswitchinterval(0.0001)
        with threads.busy_threads():
            seen.append((sys.getswitchinterval(), gc.isenabled()))
        assert sys.getswitchinterval() == pytest.approx(0.0001, rel=0.05)
        gc.disable()
        with threads.busy_threads():
            pass
        assert not gc.isenabled()  # left off: it was off before
    finally:
        gc.enable()
        sys.setswitchinterval(old)
    assert seen == [(pytest.approx(threads.SWITCH_INTERVAL, rel=0.05), False), (pytest.approx(0.0001, rel=0.05), False)]

    blobs = {f"o{i}": bytes([i]) * (64 << 10) for i in range(40)}  # two runs of 20: both threads write
    specs = [_spec(f"g{i}", blobs[f"o{i}"], f"o{i}") for i in range(40)]

    class Watching(_Reader):
        def get(self, oid):
            seen.append((round(sys.getswitchinterval(), 6), gc.isenabled()))
            return super().get(oid)

    for workers, inside in ((2, (threads.SWITCH_INTERVAL, False)), (1, (round(old, 6), True))):
        del seen[:]
        (tmp_path / str(workers)).mkdir()
        materialize.stage(Watching(blobs), tmp_path / str(workers), specs, _tmp, workers=workers)
        assert set(seen) == {inside}, workers

class _LocalVault:
    local = True  # what the materializer asks before forking: a vault in a folder


def _forced_forks(monkeypatch, processes: int = 3) -> list[int]:
    """Make ``stage`` with ``FINAL_NAME`` fork for a few bytes; the children's pids, as they are forked."""
    from envvault.vault import forked

    monkeypatch.setenv("ENVVAULT_WRITE_PROCESSES", str(processes))
    monkeypatch.setattr(materialize, "_FORK_BYTES", 0)
    # Tests run before may have left native threads (BLAKE3's pool) that keep ``can_fork`` from forking; the
    # children here never touch them. (``test_forked_checks`` runs a whole --into in a fresh interpreter.) Its
    # other rule stays: no fork while a crash test is armed.
    from envvault import crashpoints

    monkeypatch.setattr(forked, "can_fork", lambda: not crashpoints.armed())
    pids: list[int] = []
    real = forked.map_all
    monkeypatch.setattr(forked, "map_all", lambda *a, **kw: real(*a, **kw, pids=pids))
    return pids


def _writers(monkeypatch, folder) -> Callable[[], list[int]]:
    """Each process that writes a file leaves its pid in ``folder``; the pids seen so far. This process is
    slowed by 2 ms a file, so that the children it forks take runs before it has taken them all."""
    folder.mkdir()
    real = materialize._stage_one
    parent = os.getpid()

    def marked(reader, root, spec, tmp_name, *rest):
        (folder / str(os.getpid())).touch()
        if os.getpid() == parent:
            time.sleep(0.002)
        return real(reader, root, spec, tmp_name, *rest)

    monkeypatch.setattr(materialize, "_stage_one", marked)
    return lambda: sorted(int(p.name) for p in folder.iterdir())


def _final_reader(blobs):
    reader = _Reader(blobs)
    reader.vault = _LocalVault()
    return reader


@pytest.mark.parametrize("naming", ["final", "temp"])
def test_files_are_written_by_forked_processes_each_file_checked(tmp_path, monkeypatch, naming):
    """Out of a vault in a folder, the files of a new tree (final names, ``--into``) or of a restore in place
    (temp names, renamed by the caller) are written by forked children, each file checked, in pack order."""
    pids = _forced_forks(monkeypatch)
    name = materialize.FINAL_NAME if naming == "final" else _tmp
    who = _writers(monkeypatch, tmp_path / "who")
    blobs = {f"o{i}": f"data {i}".encode() * (i * 50 + 1) for i in range(80)}
    specs = [_spec(f"d{i % 4}/f{i:02}", data, oid) for i, (oid, data) in enumerate(blobs.items())]
    specs.append(FileSpec("d0/link", link="f00"))
    for d in range(4):
        (tmp_path / "root" / f"d{d}").mkdir(parents=True)
    reader = _final_reader(blobs)
    seen: list[int] = []
    root = tmp_path / "root"
    staged = materialize.stage(reader, root, specs, name, progress=seen.append, workers=16)
    assert len(pids) == 2 and set(who()) & set(pids)  # three processes: two children (which wrote) and this one
    ordered = sorted(specs, key=lambda s: materialize.pack_position(reader, s.chunks))
    assert [s.spec for s in staged] == ordered  # pack order, whoever wrote them
    assert len(seen) >= 3 and seen == sorted(seen) and seen[-1] == sum(s.size for s in specs)  # as runs end
    for s in staged:
        assert s.final == str(root / s.spec.path) and s.tmp == name(s.final)
        if s.spec.link is None:
            st = os.lstat(s.tmp)
            if naming == "final":  # its stats as written (no rename to come)
                assert (s.st.st_ino, s.st.st_size, s.st.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
            else:
                assert s.st is None and not os.path.lexists(s.final)  # nothing in place before the caller's rename
            assert s.sha256 == s.spec.sha256
            assert open(s.tmp, "rb").read() == blobs[s.spec.chunks[0]] and st.st_mode & 0o777 == 0o755
    assert os.readlink(name(str(root / "d0/link"))) == "f00"
    if naming == "temp":
        for s in staged:
            materialize.place(s)
        assert _files(root) == sorted(s.path for s in specs)  # (the link to a file is listed as a file)


@pytest.mark.parametrize("naming", ["final", "temp"])
def test_a_lying_object_in_a_forked_write_leaves_no_file(tmp_path, monkeypatch, naming):
    pids = _forced_forks(monkeypatch)
    name = materialize.FINAL_NAME if naming == "final" else _tmp
    blobs = {f"o{i}": b"y" * (i + 1) * 100 for i in range(60)}
    specs = [_spec(f"f{i:02}", blobs[f"o{i}"], f"o{i}") for i in range(60)]
    specs[33] = FileSpec("f33", ("o33",), 3400, record_sha256(hashlib.sha256(b"other").digest()), 0o644)
    with pytest.raises(CorruptError, match="f33: the vault's objects do not make the archived file"):
        materialize.stage(_final_reader(blobs), tmp_path, specs, name, workers=4)
    assert pids and _files(tmp_path) == []  # the children wrote; every file they wrote is gone


@pytest.mark.parametrize("naming", ["final", "temp"])
def test_a_run_a_killed_child_left_is_written_again_here(tmp_path, monkeypatch, naming):
    """A child that dies mid-run (killed while writing f07) answers nothing: this process writes its runs
    again, over the half-written files, and every file comes out whole."""
    pids = _forced_forks(monkeypatch)
    name = materialize.FINAL_NAME if naming == "final" else _tmp
    parent = os.getpid()
    real = materialize._stage_one
    (tmp_path / "killed").mkdir()

    def dies_in_a_child(reader, root, spec, tmp_name, *rest):
        if os.getpid() != parent:  # every child dies at its first file, half written
            with open(tmp_name(os.path.join(root, spec.path)), "wb") as f:
                f.write(b"half")
            (tmp_path / "killed" / str(os.getpid())).touch()
            os.kill(os.getpid(), 9)
        return real(reader, root, spec, tmp_name, *rest)

    monkeypatch.setattr(materialize, "_stage_one", dies_in_a_child)
    blobs = {f"o{i}": bytes([65 + i % 26]) * (i + 1) * 300 for i in range(200)}
    specs = [_spec(f"f{i:03}", blobs[f"o{i}"], f"o{i}") for i in range(200)]
    root = tmp_path / "root"
    root.mkdir()
    staged = materialize.stage(_final_reader(blobs), root, specs, name, workers=16)
    assert len(pids) == 2 and {int(p.name) for p in (tmp_path / "killed").iterdir()} & set(pids)
    assert len(staged) == 200
    for s in staged:
        materialize.place(s)  # (a file under its final name stays where it is)
    assert {p: (root / p).read_bytes() for p in _files(root)} == {s.path: blobs[s.chunks[0]] for s in specs}


@pytest.mark.parametrize("forks", [False, True])
def test_a_new_tree_s_folders_are_made_by_the_writers_as_they_reach_them(tmp_path, monkeypatch, forks):
    """``folders``: the writers (threads, or forked processes) make each missing folder as a create finds it
    missing, nested ones too, however many writers reach one at once; without it a missing folder is an
    error, and a file in the way is the callback's one error, with nothing left written."""
    from envvault.errors import EnvironmentProblem, StorageError
    from envvault.vault.fsutil import makedirs_recording

    if forks:
        _forced_forks(monkeypatch)
    blobs = {f"o{i}": f"file {i}".encode() * (i + 1) * 40 for i in range(120)}
    specs = [_spec(f"a{i % 3}/b{i % 5}/c{i % 2}/f{i:03}", blobs[f"o{i}"], f"o{i}") for i in range(120)]
    specs.append(FileSpec("a0/l/link", link="../b0"))
    made = []

    def folders(path):
        made.append(path)
        makedirs_recording(path, [], lambda q: EnvironmentProblem(f"{q} is in the way"))

    root = tmp_path / "root"
    root.mkdir()
    staged = materialize.stage(_final_reader(blobs), root, specs, materialize.FINAL_NAME, workers=4, folders=folders)
    assert len(staged) == 121 and os.readlink(root / "a0/l/link") == "../b0"
    assert {p: (root / p).read_bytes() for p in _files(root) if not p.endswith("link")} == \
        {s.path: blobs[s.chunks[0]] for s in specs if s.link is None}
    assert made or forks  # this process asked for some (the children's calls are theirs)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(StorageError, match="No such file or directory"):
        materialize.stage(_final_reader(blobs), other, specs, materialize.FINAL_NAME, workers=4)
    assert _files(other) == []
    blocked = tmp_path / "blocked"
    (blocked / "a1").mkdir(parents=True)
    (blocked / "a1" / "b1").write_bytes(b"not a folder")
    with pytest.raises(EnvironmentProblem, match=r"a1/b1 is in the way"):
        materialize.stage(_final_reader(blobs), blocked, specs, materialize.FINAL_NAME, workers=4, folders=folders)
    assert _files(blocked) == ["a1/b1"]


def test_with_a_crash_point_armed_a_new_tree_is_written_in_this_process(tmp_path, monkeypatch):
    """A crash test kills the restore at a point (``crashpoints``): a point passed in a forked writer would kill
    only that child, which its parent replaces; so with one armed, the threads of this process write."""
    from envvault import crashpoints

    pids = _forced_forks(monkeypatch)
    blobs = {f"o{i}": bytes([i]) * 4000 for i in range(30)}
    specs = [_spec(f"f{i:02}", blobs[f"o{i}"], f"o{i}") for i in range(30)]
    monkeypatch.setattr(crashpoints, "_SPEC", "no_such_point")
    (tmp_path / "a").mkdir()
    materialize.stage(_final_reader(blobs), tmp_path / "a", specs, materialize.FINAL_NAME, workers=4)
    assert pids == [] and len(_files(tmp_path / "a")) == 30
    monkeypatch.setattr(crashpoints, "_SPEC", None)
    (tmp_path / "b").mkdir()
    materialize.stage(_final_reader(blobs), tmp_path / "b", specs, materialize.FINAL_NAME, workers=4)
    assert len(pids) == 2 and len(_files(tmp_path / "b")) == 30


def test_folders_in_the_way_found_by_their_folder_listing(tmp_path):
    """``refuse_folders_in_the_way`` reads each folder the paths lie in once (``scandir``), not each path: a
    folder holding a file where a file is to go is refused, at the top and deeper; a tree of empty folders, a
    link to a folder of files, a missing folder and a file where a folder is are not in the way."""
    from envvault.errors import RefusedError
    from envvault.materialize import refuse_folders_in_the_way

    root = tmp_path / "root"
    (root / "pkg" / "empty" / "deeper").mkdir(parents=True)
    (root / "full" / "inner").mkdir(parents=True)
    (root / "full" / "inner" / "kept.txt").write_text("mine\n")
    (root / "pkg" / "link").symlink_to(root / "full")
    (root / "plain").write_text("a file\n")
    refuse_folders_in_the_way(root, ["pkg/empty", "pkg/link", "gone/a.py", "gone/b/c.py", "plain/x.py", "pkg/new.py"])
    for rel in ("full", "pkg/link/inner"):
        with pytest.raises(RefusedError, match="non-empty directory where the snapshot has a file"):
            refuse_folders_in_the_way(root, ["pkg/new.py", rel])


def test_a_progress_sink_that_fails_at_the_end_of_a_forked_stage_leaves_no_temp_file(tmp_path, monkeypatch):
    """The last ``progress`` call of a forked stage (the total, once every child has answered) raising: every
    temp file the children wrote is deleted, as after any failure (helper 33: all were left, and the
    restore's journal with them was removed)."""
    _forced_forks(monkeypatch)
    blobs = {f"o{i}": f"data {i}".encode() * (i * 20 + 1) for i in range(60)}
    specs = [_spec(f"f{i:02}", blobs[f"o{i}"], f"o{i}") for i in range(60)]
    total = sum(s.size for s in specs)
    ends = []

    def progress(done):  # the runs' calls reach the total once; the stage's last call says it again
        if done == total:
            ends.append(done)
            if len(ends) == 2:
                raise KeyError("a broken bar")

    with pytest.raises(KeyError):
        materialize.stage(_final_reader(blobs), tmp_path, specs, _tmp, progress=progress, workers=4)
    assert len(ends) == 2 and _files(tmp_path) == []

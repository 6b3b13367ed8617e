"""Reading objects without loading the whole index (``Vault.locate``): index files are read the most recently
written first and only until the object is found, so restoring a compile cache archived last parses the index
file of its own pack, not those of a whole environment's 100 packs; an object in an older pack, and one written
by another process after the first look, are still found; a missing one is a clear error."""

from __future__ import annotations

import os

import pytest

from envvault.errors import CorruptError
from envvault.model.encoding import object_id
from envvault.vault.store import ObjectReader, Vault
from envvault.vault.transaction import pack_writing


def _loads_counted(vault: Vault) -> list[str]:
    seen: list[str] = []
    load = vault.backend.load

    def counting(kind, name, *a, **k):
        if kind == "index":
            seen.append(name)
        return load(kind, name, *a, **k)

    vault.backend.load = counting
    return seen


def _write_packs(root) -> list[tuple[str, bytes]]:
    """Five packs, each of one blob, index files dated in order: the last written is the newest."""
    vault = Vault.open(root, create=True)
    out = []
    for n in range(5):
        blob = f"blob {n} ".encode() * 100
        before = set(vault.backend.list("index"))
        with pack_writing(vault) as writer:
            writer.add(object_id(blob), blob)
        (pid,) = set(vault.backend.list("index")) - before
        os.utime(vault.backend.path("index", pid), ns=(10**18 + n * 10**9,) * 2)
        out.append((pid, blob))
    return out


def test_the_newest_object_reads_one_index_file(tmp_path):
    packs = _write_packs(tmp_path / "v")
    vault = Vault.open(tmp_path / "v")
    seen = _loads_counted(vault)
    newest_pid, newest = packs[-1]
    assert bytes(ObjectReader(vault).get(object_id(newest))) == newest
    assert seen == [newest_pid]


def test_an_older_object_reads_newest_first_until_found(tmp_path):
    packs = _write_packs(tmp_path / "v")
    vault = Vault.open(tmp_path / "v")
    seen = _loads_counted(vault)
    pid, blob = packs[1]
    assert vault.get(object_id(blob)) == blob
    assert seen == [p for p, _ in packs[1:]][::-1]
    # the whole index afterwards loads only the files not read yet, and agrees with a fresh vault's
    assert vault.index() == Vault.open(tmp_path / "v").index()
    assert sorted(seen) == sorted(p for p, _ in packs)


def test_an_object_written_after_the_first_look_is_found(tmp_path):
    _write_packs(tmp_path / "v")
    vault = Vault.open(tmp_path / "v")
    reader = ObjectReader(vault)
    assert reader.locate("0" * 64) is None  # loads every index file, then lists again
    other = Vault.open(tmp_path / "v")  # another process writes a pack
    late = b"written later" * 50
    with pack_writing(other) as writer:
        writer.add(object_id(late), late)
    assert bytes(reader.get(object_id(late))) == late


def test_a_missing_object_is_a_clear_error(tmp_path):
    _write_packs(tmp_path / "v")
    with pytest.raises(CorruptError, match="missing from the vault; run `envvault verify`"):
        ObjectReader(Vault.open(tmp_path / "v")).get("f" * 64)


def test_an_index_file_that_fails_once_is_read_again(tmp_path):
    """A read error on an index file (EIO on NFS, a bucket's error after its retries) hides its objects only
    until the next look: the refresh on a miss reads it again."""
    from envvault.vault.backend import ReadFailed

    packs = _write_packs(tmp_path / "v")
    vault = Vault.open(tmp_path / "v")
    pid, blob = packs[2]
    load, failed = vault.backend.load, []

    def flaky(kind, name, *a, **k):
        if kind == "index" and name == pid and not failed:
            failed.append(name)
            raise ReadFailed(f"cannot read {name}: Input/output error", "Input/output error")
        return load(kind, name, *a, **k)

    vault.backend.load = flaky
    assert bytes(ObjectReader(vault).get(object_id(blob))) == blob
    assert failed == [pid]


def test_ordering_files_by_pack_lists_the_index_once_whatever_is_missing(tmp_path):
    """The materializer orders files by where their first chunk lies; chunks the vault lacks (a damaged or
    hostile vault) must not list the index again for each file: the read that follows reports them."""
    from envvault.materialize import pack_position

    _write_packs(tmp_path / "v")
    vault = Vault.open(tmp_path / "v")
    lists = []
    listing = vault.backend.list
    vault.backend.list = lambda kind: lists.append(kind) or listing(kind)
    reader = ObjectReader(vault)
    assert [pack_position(reader, [f"{n:064x}"]) for n in range(200)] == [("", 0, 0)] * 200
    assert lists.count("index") == 1


def test_the_same_copy_is_read_whichever_way_a_command_first_looks(tmp_path):
    """An object in two packs (two snaps at once): a command that asks ``has`` first and one that reads first
    take the same copy, the newest."""
    root = tmp_path / "v"
    Vault.open(root, create=True)
    blob = b"the duplicated object " * 40
    pids = []
    for n in range(2):
        vault = Vault.open(root)  # a fresh process each time: its writer does not know the other copy
        before = set(vault.backend.list("index"))
        with pack_writing(vault) as writer:
            writer.add(object_id(blob), blob)
            writer.add(object_id(b"pad %d" % n), b"pad %d" % n)
        (pid,) = set(vault.backend.list("index")) - before
        os.utime(vault.backend.path("index", pid), ns=(10**18 + n * 10**9,) * 2)
        pids.append(pid)
    first_look = Vault.open(root)
    assert first_look.has(object_id(blob))
    assert first_look.locate(object_id(blob))[0] == pids[1]
    assert Vault.open(root).locate(object_id(blob))[0] == pids[1]


def test_has_waits_for_a_reader_that_is_loading_an_index_file(tmp_path):
    """A restore's reader thread loading index files (``locate``) and another thread asking ``has`` share one
    lock: ``has`` waits for the file being loaded (loaded once, never seen half-merged) and then answers
    "present"; without the lock it loads the file a second time beside the reader, into the same dict."""
    import threading

    packs = _write_packs(tmp_path / "v")
    vault = Vault.open(tmp_path / "v")
    pid, blob = packs[1]
    entered, release = threading.Event(), threading.Event()
    load = vault.backend.load

    def held(kind, name, *a, **k):
        if kind == "index" and name == pid and not entered.is_set():
            entered.set()
            release.wait(30)  # the reader holds this file's load until the test lets it go
        return load(kind, name, *a, **k)

    vault.backend.load = held
    got = []
    reader = threading.Thread(target=lambda: got.append(bytes(ObjectReader(vault).get(object_id(blob)))))
    reader.start()
    assert entered.wait(30)
    answer: list = []
    asker = threading.Thread(target=lambda: answer.append(vault.has(object_id(blob))))
    asker.start()
    asker.join(1.0)  # unlocked, it would answer at once, loading the file beside the reader
    assert answer == [], answer
    release.set()
    reader.join(30)
    asker.join(30)
    assert answer == [True] and got == [blob]

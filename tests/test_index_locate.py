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

"""verify: the structure by default (snapshots and manifests parse, every referenced object is indexed and its
pack listed; no pack data read), every object re-hashed with read_data; over a local and an in-memory
backend (the s3:// runs are in test_s3_vault.py)."""

from __future__ import annotations

import os

from envvault.vault.store import Vault
from envvault.vault.verify import verify_vault
from test_backend import _id, _snapshot, vault  # noqa: F401 - the fixture (local and memory backends)


def _fresh(vault: Vault) -> Vault:  # noqa: F811
    """The same vault opened anew (no index or frame cached in this process)."""
    return Vault(vault.backend, vault.config, vault.state)


def test_structure_reads_no_data_and_read_data_rehashes_it(vault):  # noqa: F811
    big = os.urandom(3 << 20)  # chunks of a file this large are frames of their own
    sid, mid = _snapshot(vault, {"big.bin": big, "small.py": b"x = 1\n"})
    plain = verify_vault(_fresh(vault))
    full = verify_vault(_fresh(vault), read_data=True)
    assert plain["ok"] and full["ok"] and not plain["read_data"] and full["read_data"]
    assert plain["objects"] == full["objects"] == 3
    assert plain["bytes"] < 10_000 and full["bytes"] >= len(big)  # the manifest only, then everything

    # Damage the big blob's frame: only reading the data finds it.
    pack, fo, fl, *_ = _fresh(vault).index()[_id(big)]
    data = bytearray(vault.backend.load("packs", pack))
    data[fo + fl // 2] ^= 0xFF
    vault.backend.save("packs", pack, bytes(data))
    assert verify_vault(_fresh(vault))["ok"]
    report = verify_vault(_fresh(vault), read_data=True)
    assert not report["ok"] and [p["object"] for p in report["problems"]] == [_id(big)]
    assert report["problems"][0]["snapshots"] == [sid]
    # A reader of the damaged object says which check finds it (plain verify says ok: helper 31).
    import pytest

    from envvault.errors import CorruptError

    with pytest.raises(CorruptError, match=r"run `envvault verify --read-data`"):
        _fresh(vault).get(_id(big))


def test_structure_names_a_lost_pack(vault):  # noqa: F811
    first, m1 = _snapshot(vault, {"a.py": b"a" * 100})
    (p1,) = vault.backend.list("packs")
    second, m2 = _snapshot(vault, {"a.py": b"a" * 100, "b.py": b"b" * 100})  # a.py stays in the first pack
    vault.backend.remove("packs", p1)
    report = verify_vault(_fresh(vault))
    by_object = {p["object"]: p for p in report["problems"]}
    assert not report["ok"] and set(by_object) == {m1, _id(b"a" * 100)}
    assert by_object[m1]["snapshots"] == [first]
    assert "pack" in by_object[_id(b"a" * 100)]["problem"] and by_object[_id(b"a" * 100)]["snapshots"] == [second]


def test_a_manifest_that_does_not_parse_is_a_problem(vault):  # noqa: F811
    sid, mid = _snapshot(vault, {"../escape.py": b"evil"})  # a hostile path: the parser refuses it
    report = verify_vault(_fresh(vault))
    assert not report["ok"] and report["problems"][0]["object"] == mid
    assert "escape.py" in report["problems"][0]["problem"] and report["problems"][0]["snapshots"] == [sid]

"""A pack's index file may say anything (a shared vault, a vault from someone else): ``index_locations``
(envvault/vault/store.py) refuses every shape envvault does not write with one of the errors ``Vault.index``
treats as "damaged", a damaged file gives none of its objects (not the ones before the damage), and an
object listed by two index files keeps the location of the most recently written one, however a command first
looks."""

from __future__ import annotations

import json
import os

import pytest

from envvault.vault.store import Vault, index_locations

PACK = "a" * 64
OID = "b" * 64
GOOD = {"pack": PACK, "frames": [[8, 100], [108, 50]], "objects": {OID: [1, 0, 10, "b"], "c" * 64: [0, 5, 7, "m"]}}
ERRORS = (TypeError, ValueError, KeyError, IndexError)


def _bad(**change) -> dict:
    doc = json.loads(json.dumps(GOOD))
    for key, value in change.items():
        if key == "obj":
            doc["objects"][OID] = value
        elif key == "frame":
            doc["frames"][1] = value
        else:
            doc[key] = value
    return doc


BAD = {
    "not a dict": [GOOD],
    "no pack": {k: v for k, v in GOOD.items() if k != "pack"},
    "pack not an id": _bad(pack="../../etc"),
    "frames a dict": _bad(frames={"0": [8, 100]}),
    "objects a list": _bad(objects=[[OID, 1, 0, 10, "b"]]),
    "location of three": _bad(obj=[1, 0, 10]),
    "location of five": _bad(obj=[1, 0, 10, "b", 4]),
    "location a string": _bad(obj="1010"),
    "negative offset": _bad(obj=[1, -1, 10, "b"]),
    "negative frame index": _bad(obj=[-1, 0, 10, "b"]),
    "frame index past the frames": _bad(obj=[2, 0, 10, "b"]),
    "float length": _bad(obj=[1, 0, 10.0, "b"]),
    "bool frame index": _bad(obj=[True, 0, 10, "b"]),
    "string offset": _bad(obj=[1, "0", 10, "b"]),
    "null length": _bad(obj=[1, 0, None, "b"]),
    "frame of one": _bad(frame=[108]),
    "frame of three": _bad(frame=[108, 50, 1]),
    "negative frame length": _bad(frame=[108, -50]),
    "frame a string": _bad(frame="ab"),
    "bool frame offset": _bad(frame=[False, 50]),
    "frame offset past any pack": _bad(frame=[1 << 63, 50]),
    "object length past any pack": _bad(obj=[1, 0, 1 << 70, "b"]),
    "kind a list": _bad(obj=[1, 0, 10, ["b"]]),
    "kind null": _bad(obj=[1, 0, 10, None]),
    "object id too short": {**GOOD, "objects": {"b" * 63: [1, 0, 10, "b"]}},
    "object id too long": {**GOOD, "objects": {"b" * 65: [1, 0, 10, "b"]}},
    "object id in capitals": {**GOOD, "objects": {"B" * 64: [1, 0, 10, "b"]}},
    "object id a path": {**GOOD, "objects": {("../" * 22)[:64]: [1, 0, 10, "b"]}},
    "object id not ascii": {**GOOD, "objects": {"\u00e9" * 64: [1, 0, 10, "b"]}},
    "one bad id among good": {**GOOD, "objects": {**GOOD["objects"], "b" * 63 + "g": [1, 0, 10, "b"]}},
}


def test_a_good_index_gives_every_location():
    assert index_locations(GOOD) == {OID: (PACK, 108, 50, 0, 10, "b"), "c" * 64: (PACK, 8, 100, 5, 7, "m")}


@pytest.mark.parametrize("shape", sorted(BAD))
def test_every_bad_shape_is_refused(shape):
    with pytest.raises(ERRORS):
        index_locations(BAD[shape])


def test_an_index_must_name_its_own_pack():
    assert index_locations(GOOD, PACK) == index_locations(GOOD)
    with pytest.raises(ERRORS):
        index_locations(GOOD, "d" * 64)


def test_gc_keeps_the_pack_of_an_index_that_names_another_pack(tmp_path):
    """An index file that names another pack is damaged as a whole, for gc as for reads: its pack is kept
    (with a warning) and the other pack is not touched through it."""
    from envvault.vault.gc import collect_garbage
    from envvault.vault.store import read_index

    vault = Vault.open(tmp_path / "v", create=True)
    packs = tmp_path / "v" / "packs"
    for pid in (PACK, "d" * 64):
        (packs / pid[:2]).mkdir(parents=True, exist_ok=True)
        (packs / pid[:2] / f"{pid}.pack").write_bytes(b"EVPK\x01\x00\x00\x00" + b"x" * 200)
    (tmp_path / "v" / "index" / f"{'d' * 64}.idx").write_text(json.dumps(GOOD))  # says it is PACK's
    assert read_index(vault.backend, "d" * 64) is None and vault.index() == {}
    result = collect_garbage(vault)
    assert any("d" * 12 in w and "unreadable" in w for w in result.warnings), result.warnings
    assert (packs / "dd" / f"{'d' * 64}.pack").exists()
    assert (tmp_path / "v" / "index" / f"{'d' * 64}.idx").exists()


def test_a_damaged_index_gives_none_of_its_objects_and_the_newest_wins(tmp_path):
    vault = Vault.open(tmp_path / "v", create=True)
    folder = tmp_path / "v" / "index"
    # its first object is fine, its second is not: neither is taken
    damaged = {"pack": "d" * 64, "frames": [[8, 100]], "objects": {"c" * 64: [0, 5, 7, "m"], OID: [0, 0, 10.5, "b"]}}
    (folder / f"{'d' * 64}.idx").write_text(json.dumps(damaged))
    first = dict(GOOD, objects={"e" * 64: [0, 0, 1, "b"]})
    (folder / f"{PACK}.idx").write_text(json.dumps(first))
    second = {"pack": "f" * 64, "frames": [[8, 9]], "objects": {"e" * 64: [0, 3, 4, "b"], "9" * 64: [0, 0, 2, "b"]}}
    (folder / f"{'f' * 64}.idx").write_text(json.dumps(second))
    for when, pid in enumerate((PACK, "f" * 64, "d" * 64)):  # the f pack's index is newer than PACK's
        os.utime(folder / f"{pid}.idx", ns=(10**18 + when * 10**9,) * 2)
    idx = vault.index()
    assert "c" * 64 not in idx and OID not in idx
    assert idx["e" * 64][0] == "f" * 64 and idx["9" * 64] == ("f" * 64, 8, 9, 0, 2, "b")
    # reads that locate it first agree (a vault that has not loaded the whole index)
    assert Vault.open(tmp_path / "v").locate("e" * 64)[0] == "f" * 64

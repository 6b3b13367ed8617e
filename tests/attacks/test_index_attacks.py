"""A pack's index file may say anything (a shared vault, a vault from someone else): ``index_locations``
(envvault/vault/store.py) refuses every shape envvault does not write with one of the errors ``Vault.index``
treats as "damaged", a damaged file gives none of its objects (not the ones before the damage), and an
object listed by two index files keeps the location of the first one listed."""

from __future__ import annotations

import json

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
}


def test_a_good_index_gives_every_location():
    assert index_locations(GOOD) == {OID: (PACK, 108, 50, 0, 10, "b"), "c" * 64: (PACK, 8, 100, 5, 7, "m")}


@pytest.mark.parametrize("shape", sorted(BAD))
def test_every_bad_shape_is_refused(shape):
    with pytest.raises(ERRORS):
        index_locations(BAD[shape])


def test_a_damaged_index_gives_none_of_its_objects_and_the_first_listed_wins(tmp_path):
    vault = Vault.open(tmp_path / "v", create=True)
    folder = tmp_path / "v" / "index"
    # its first object is fine, its second is not: neither is taken
    damaged = {"pack": "d" * 64, "frames": [[8, 100]], "objects": {"c" * 64: [0, 5, 7, "m"], OID: [0, 0, 10.5, "b"]}}
    (folder / f"{'d' * 64}.idx").write_text(json.dumps(damaged))
    first = dict(GOOD, objects={"e" * 64: [0, 0, 1, "b"]})
    (folder / f"{PACK}.idx").write_text(json.dumps(first))
    second = {"pack": "f" * 64, "frames": [[8, 9]], "objects": {"e" * 64: [0, 3, 4, "b"], "9" * 64: [0, 0, 2, "b"]}}
    (folder / f"{'f' * 64}.idx").write_text(json.dumps(second))
    idx = vault.index()
    assert "c" * 64 not in idx and OID not in idx
    names = vault.backend.list("index")
    winner = PACK if names.index(PACK) < names.index("f" * 64) else "f" * 64
    assert idx["e" * 64][0] == winner and idx["9" * 64] == ("f" * 64, 8, 9, 0, 2, "b")

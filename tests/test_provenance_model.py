"""Guard's provenance entries as records (model/provenance.py): one parser naming every problem, the
canonical form written back unchanged (unknown keys kept), and the snapshot parser giving records."""

from __future__ import annotations

import pytest

from envvault.errors import CorruptError
from envvault.model.encoding import canonical_json
from envvault.model.provenance import ProvenanceEntry, parse_provenance, provenance_dict
from envvault.model.snapshot import build_snapshot, parse_snapshot

ENTRY = {"url": "https://files.pythonhosted.org/packages/x/torch-2.11.0-cp311-none-any.whl", "sha256": "ab" * 32,
         "index": "https://pypi.org/simple", "version": "2.11.0", "build_id": "cd" * 32}


def test_entries_parse_and_write_back_unchanged():
    doc = {"torch": ENTRY, "six": dict(ENTRY, index=None, build_id=None, mirror="kept")}
    got = parse_provenance(doc)
    assert got["torch"] == ProvenanceEntry(**ENTRY)
    assert got["six"].index is None and got["six"].extra == {"mirror": "kept"}
    assert canonical_json(provenance_dict(got)) == canonical_json(doc)
    assert parse_provenance(None) == {}


def test_every_problem_is_named_with_its_place():
    bad = {"torch": {"url": 3, "index": 5, "version": "1"}, "six": "no"}
    with pytest.raises(CorruptError) as err:
        parse_provenance(bad)
    assert err.value.problems == ["provenance.torch.url: expected a string", "provenance.torch.sha256: missing",
                                  "provenance.torch.index: expected a string or null",
                                  "provenance.six: expected an object"]


def _snapshot(extra):
    return build_snapshot(created="2026-12-01T00:00:00Z", message="", trigger="guard", argv=[], venv="/v",
                          lock_only=False, python={"version": "3.11.7"}, host={}, env={}, packages=[], caches=[],
                          fingerprint=None, warnings=[], stats={"new_bytes": 0}, tool={}, extra=extra)


def test_a_snapshot_holds_records_and_writes_the_same_document():
    snap = _snapshot({"provenance": {"torch": ProvenanceEntry(**ENTRY)}})
    assert snap.provenance["torch"].sha256 == ENTRY["sha256"]
    doc = snap.to_dict()
    assert doc["provenance"] == {"torch": ENTRY}
    assert parse_snapshot(doc, "again").to_dict() == doc
    with pytest.raises(CorruptError, match=r"provenance\.torch\.version: expected a string"):
        parse_snapshot(dict(doc, provenance={"torch": dict(ENTRY, version=2)}), "snapshot x")

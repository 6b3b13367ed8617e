"""The records of envvault/model/ against the format contract (docs/format.md): every snapshot and distribution
manifest sample round-trips exactly through parse -> to_dict, hostile paths are refused by the parser with
their place, and a document with several problems gets all of them named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envvault.errors import CorruptError, RefusedError, UsageError
from envvault.model.encoding import canonical_json
from envvault.model.manifest import DistManifest, FileEntry, parse_dist_manifest
from envvault.model.snapshot import (
    CacheEntry, PackageSummary, PythonInfo, Snapshot, build_snapshot, parse_snapshot, snapshot_problems,
)

FORMAT_MD = Path(__file__).resolve().parent.parent / "docs" / "format.md"
_SHORT_ID = re.compile(r'"([0-9a-f]{4})\.\.\."')


def _samples() -> list[dict]:
    """Every ```json block of docs/format.md, its shortened ids (``"3f0a..."``) made full 64-hex ones."""
    text = FORMAT_MD.read_text()
    out = []
    for block in re.findall(r"```json\n(.*?)```", text, re.S):
        block = _SHORT_ID.sub(lambda m: '"' + m.group(1) * 16 + '"', block)
        out.append(json.loads(block))
    return out


def _kind(doc: dict) -> str:
    if "packages" in doc and "python" in doc:
        return "snapshot"
    if doc.get("kind") == "dist":
        return "dist"
    if "root" in doc and "reason" in doc:
        return "cache-entry"
    return "other"


SAMPLES = _samples()


def test_the_format_document_has_the_samples_this_test_reads():
    kinds = [_kind(d) for d in SAMPLES]
    assert kinds.count("snapshot") >= 1 and kinds.count("dist") >= 1 and kinds.count("cache-entry") >= 1, kinds


@pytest.mark.parametrize("doc", [d for d in SAMPLES if _kind(d) == "snapshot"])
def test_snapshot_samples_round_trip(doc):
    snap = parse_snapshot(doc)
    assert canonical_json(snap.to_dict()) == canonical_json(doc)
    assert snap.to_dict() == doc
    torch = snap.packages[0]
    assert isinstance(torch, PackageSummary) and torch.name == "torch" and torch.identity == 2
    assert snap.python.version == "3.11.7" and snap.python.minor == "3.11"
    assert snap.host is not None and snap.host.gpus[0].name == "NVIDIA H200"
    assert snap.stats is not None and snap.stats.seconds == 41.2


@pytest.mark.parametrize("doc", [d for d in SAMPLES if _kind(d) == "dist"])
def test_dist_manifest_samples_round_trip(doc):
    man = parse_dist_manifest(doc)
    assert isinstance(man, DistManifest) and isinstance(man.files[0], FileEntry)
    assert canonical_json(man.to_dict()) == canonical_json(doc)
    assert man.files[0].chunks == (doc["files"][0]["chunks"][0],)


@pytest.mark.parametrize("entry", [d for d in SAMPLES if _kind(d) == "cache-entry"])
def test_cache_entry_samples_round_trip_inside_a_snapshot(entry):
    doc = next(d for d in SAMPLES if _kind(d) == "snapshot")
    doc = dict(doc, caches=[entry])
    snap = parse_snapshot(doc)
    assert isinstance(snap.caches[0], CacheEntry) and snap.caches[0].reason == "TORCHINDUCTOR_CACHE_DIR"
    assert canonical_json(snap.to_dict()) == canonical_json(doc)


def _snapshot_doc(**over) -> dict:
    doc = next(d for d in SAMPLES if _kind(d) == "snapshot")
    return json.loads(json.dumps(dict(doc, **over)))


def test_old_documents_keep_what_they_lack_and_carry_unknown_keys():
    doc = _snapshot_doc(future_key={"a": [1, 2]})
    for key in ("identity", "scripts", "exec", "build_info", "requested"):
        doc["packages"][0].pop(key, None)
    doc["packages"][0]["unknown"] = 7
    doc["python"]["newer"] = "x"
    doc.pop("host")
    doc.pop("caches")
    doc["caches"] = None
    snap = parse_snapshot(doc)
    p = snap.packages[0]
    assert p.identity == 1 and p.exec is None and p.extra == {"unknown": 7}
    assert snap.host is None and snap.caches is None and snap.extra == {"future_key": {"a": [1, 2]}}
    assert canonical_json(snap.to_dict()) == canonical_json(doc)


def test_a_document_with_several_problems_names_every_one_with_its_place():
    doc = _snapshot_doc(created=3, lock_only="no")
    doc["packages"].append({"name": "x", "version": "1", "build_id": "nothex", "state_id": "a" * 64})
    doc["packages"].append(5)
    doc["python"]["version"] = 311
    doc["host"]["gpus"] = [{"memory": "1"}]
    doc["stats"]["seconds"] = "fast"
    doc["caches"] = [{"manifest": "short", "files": "many"}]
    expected = [
        "created: expected a string",
        "lock_only: expected true or false",
        "python.version: expected a string or null",
        "host.gpus[0].name: missing",
        "packages[1].build_id: expected a 64-hex string",
        "packages[1].manifest: missing",
        "packages[2]: expected an object",
        "caches[0].manifest: expected a 64-hex string or null",
        "caches[0].files: expected an integer",
        "stats.seconds: expected a number",
    ]
    assert sorted(snapshot_problems(doc)) == sorted(expected)
    with pytest.raises(CorruptError) as err:
        parse_snapshot(doc, "snapshot abc")
    assert sorted(err.value.problems) == sorted(expected)
    assert str(err.value).startswith("snapshot abc is malformed (") and "and 5 more" in str(err.value)
    assert snapshot_problems([]) == ["expected a JSON object"]


def test_a_newer_format_is_a_usage_error():
    with pytest.raises(UsageError):
        parse_snapshot(_snapshot_doc(format=2))
    man = next(d for d in SAMPLES if _kind(d) == "dist")
    with pytest.raises(UsageError):
        parse_dist_manifest(dict(man, format=2))


def _manifest_with(entry: dict) -> dict:
    man = json.loads(json.dumps(next(d for d in SAMPLES if _kind(d) == "dist")))
    man["files"].append(entry)
    return man


@pytest.mark.parametrize("entry,needle", [
    ({"path": "/etc/passwd", "record": "x.py"}, "files[1].path '/etc/passwd' is absolute"),
    ({"path": "lib/../../escape.py", "record": "x.py"}, "files[1].path 'lib/../../escape.py' contains '..'"),
    ({"path": "lib/x\x00.py", "record": "x.py"}, "files[1].path 'lib/x\\x00.py' contains NUL"),
    ({"path": "lib/x.py", "record": "pkg/../../escape.py"}, "files[1].record 'pkg/../../escape.py' contains '..'"),
    ({"path": "lib/x.py", "record": "/abs/escape.py"}, "files[1].record '/abs/escape.py' is absolute"),
    ({"path": "lib/x.py", "record": "..\\..\\escape.py"}, "files[1].record '..\\\\..\\\\escape.py' contains a backslash"),
    ({"path": "lib/x.py", "record": "pkg/x\x00.py"}, "files[1].record 'pkg/x\\x00.py' contains NUL"),
    ({"path": "", "record": "x.py"}, "files[1].path: not a path"),
    ({"record": "x.py"}, "files[1].path: not a path"),
])
def test_hostile_paths_are_refused_by_the_parser_with_their_place(entry, needle):
    entry = dict({"state": "ok", "size": 1, "sha256": "x", "mode": 420, "chunks": []}, **entry)
    with pytest.raises(RefusedError) as err:
        parse_dist_manifest(_manifest_with(entry), "manifest abc")
    assert str(err.value).startswith("refusing manifest abc: ")
    assert needle in str(err.value), str(err.value)


def test_scripts_rows_outside_site_packages_are_not_hostile():
    entry = {"path": "bin/tool", "record": "../../../bin/tool", "state": "ok", "size": 1, "sha256": "x",
             "mode": 493, "chunks": []}
    man = parse_dist_manifest(_manifest_with(entry))
    assert man.files[1].record == "../../../bin/tool"


def test_a_hostile_dist_info_is_refused():
    man = dict(next(d for d in SAMPLES if _kind(d) == "dist"), dist_info="../../elsewhere.dist-info")
    with pytest.raises(RefusedError, match=r"dist_info '../../elsewhere.dist-info' contains '..'"):
        parse_dist_manifest(man)


def test_every_unsafe_path_is_named_and_malformed_files_too():
    man = _manifest_with({"path": "/a", "record": "a"})
    man["files"].append({"path": "../b", "record": "b"})
    man["files"].append({"path": "ok.py", "record": "ok.py", "state": "weird", "chunks": ["x"]})
    with pytest.raises(RefusedError) as err:
        parse_dist_manifest(man, "manifest m")
    assert "files[1].path '/a' is absolute" in str(err.value) and "files[2].path '../b'" in str(err.value)
    assert any(p.startswith("files[3].state") for p in err.value.problems)
    assert any(p.startswith("files[3].chunks") for p in err.value.problems)
    man["files"] = man["files"][:1] + man["files"][3:]
    with pytest.raises(CorruptError) as err:
        parse_dist_manifest(man, "manifest m")
    assert "files[1].state" in str(err.value) and "files[1].chunks" in str(err.value)


def test_build_snapshot_writes_what_parse_reads():
    doc = _snapshot_doc()
    snap = build_snapshot(
        created=doc["created"], message=doc["message"], trigger="manual", argv=doc["argv"], venv=doc["venv"],
        lock_only=False, python=doc["python"], host=doc["host"], env=doc["env"], packages=doc["packages"],
        caches=[], fingerprint=doc["fingerprint"], warnings=[], stats=dict(doc["stats"], new_bytes=0),
        tool=doc["tool"], extra={"guard": {"phase": "before", "command": ["pip", "install", "x"]}},
    )
    assert isinstance(snap, Snapshot) and snap.guard.phase == "before" and snap.guard.command[0] == "pip"
    written = snap.to_dict()
    assert written["stats"]["new_bytes"] > 0 and parse_snapshot(written) == snap
    cache_only = build_snapshot(
        kind="cache-snapshot", created=doc["created"], message="", trigger="cache-snap", argv=[], venv=None,
        lock_only=False, python=PythonInfo.unknown(), host=doc["host"], env={}, packages=[], caches=[],
        fingerprint=None, warnings=[], stats=dict(doc["stats"], new_bytes=0), tool=doc["tool"],
    )
    assert cache_only.to_dict()["python"] == dict.fromkeys(("implementation", "version", "abi", "soabi", "platform"))
    with pytest.raises(CorruptError):
        build_snapshot(created=doc["created"], message="", trigger="manual", argv=[], venv=None, lock_only=False,
                       python=doc["python"], host={}, env={}, packages=[{"name": "x"}], caches=[],
                       fingerprint=None, warnings=[], stats=dict(doc["stats"]), tool={})


def test_records_are_frozen_and_to_dict_gives_copies():
    snap = parse_snapshot(_snapshot_doc())
    with pytest.raises(AttributeError):
        snap.venv = "/elsewhere"  # type: ignore[misc]
    out = snap.to_dict()
    out["packages"][0]["name"] = "changed"
    out["host"]["gpus"].clear()
    assert snap.packages[0].name == "torch" and snap.to_dict()["host"]["gpus"]


def test_the_vault_loads_records_and_refuses_a_hostile_manifest_on_load(tmp_path):
    from envvault.vault.store import Vault
    from tests.attacks.craft import init_vault, put_manifest, put_snapshot

    root = init_vault(tmp_path / "vault")
    good = next(d for d in SAMPLES if _kind(d) == "dist")
    bad = _manifest_with({"path": "../outside.py", "record": "../../../../outside.py", "state": "ok"})
    good_id, bad_id = put_manifest(root, good), put_manifest(root, bad)
    sid = put_snapshot(root, _snapshot_doc())
    vault = Vault.open(root)
    ref = vault.load_snapshot(sid)
    assert ref.id == sid and isinstance(ref.snapshot, Snapshot) and ref.snapshot.to_json() == (root / "snapshots" / f"{sid}.json").read_bytes()
    assert vault.load_manifest(good_id) == parse_dist_manifest(good)
    with pytest.raises(RefusedError, match=r"refusing manifest [0-9a-f]{12}: files\[1\]\.path '\.\./outside\.py' contains '\.\.'"):
        vault.load_manifest(bad_id)


def test_loose_documents_and_builds():
    from envvault.diff import diff_snapshots
    from envvault.model.identity import same_build
    from envvault.model.snapshot import loose_snapshot

    lock = {"kind": "lockfile", "venv": None, "python": None, "host": None, "env": None,
            "packages": [{"name": "x", "version": "1", "build_id": None, "state_id": None, "identity": 1}]}
    snap = loose_snapshot(lock)
    assert snap.packages[0].build_id == "" and {"python", "host", "env"} <= snap.absent
    full = parse_snapshot(_snapshot_doc())
    torch = full.packages[0]
    assert same_build(torch, torch) is True
    assert same_build(torch, PackageSummary(**{**_fields(torch), "build_id": "f" * 64})) is False
    assert same_build(torch, PackageSummary(**{**_fields(torch), "identity": 1})) is None
    r = diff_snapshots(full, lock)
    assert [p.name for p in r.added] == ["x"] and [p.name for p in r.removed] == ["torch"]
    assert not r.python and not r.host and not r.env  # the lockfile side has none of them


def _fields(p: PackageSummary) -> dict:
    from envvault.model.records import fields

    return {f.name: getattr(p, f.name) for f in fields(p)}


def test_the_fast_path_of_todays_summaries_reads_what_the_generic_one_reads():
    from envvault.model._fields import load_fields
    from envvault.model.snapshot import _fast_package, parse_package_summary

    p = dict(_snapshot_doc()["packages"][0], exec=["lib/python3.11/site-packages/torch/bin/torch_shm_manager"])
    assert len(p) == 16
    fast = _fast_package(p)
    kw, absent, extra = load_fields(p, PackageSummary.KEYS, "", [])
    assert fast is not None and fast == PackageSummary(**kw, extra=extra, absent=absent) and fast.to_dict() == p
    for key, bad in (("build_id", "nothex"), ("files", True), ("modified", [1]), ("exec", "x"), ("requested", 1)):
        problems: list[str] = []
        assert _fast_package(dict(p, **{key: bad})) is None
        parse_package_summary(dict(p, **{key: bad}), "packages[0].", problems)
        assert [q.split(":")[0] for q in problems] == [f"packages[0].{key}"]

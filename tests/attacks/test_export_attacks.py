"""Hostile vaults against `export` (issue 14, items 11 and 12): a manifest name or file path that would put a
wheel, or a wheel member, outside where it belongs, and a vault that lost index files.

Each vault is crafted from docs/format.md alone (``tests/attacks/craft.py``). Every attack asserts one clean
line and its documented exit code (3: refused, unsafe content in a vault; 5: damaged data), a decoy folder
untouched, and nothing half-written: no lockfile, no wheel folder.
"""

from __future__ import annotations

import base64
import hashlib
import os

import pytest

from tests.attacks.craft import (
    blake, decoy, init_vault, one_line, put_manifest, put_snapshot, run_cli, snapshot_doc, write_pack,
)

SP = "lib/python3.11/site-packages"
PYTHON = {"abi": "cp311", "implementation": "cpython", "platform": "linux-x86_64", "version": "3.11.7",
          "purelib": SP, "platlib": SP, "scripts": "bin", "executable": "bin/python"}
PAYLOAD = b"VALUE = 1\n"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _file(record: str, path: str | None = None, data: bytes = PAYLOAD) -> dict:
    return {"path": path or f"{SP}/{record}", "record": record, "sha256": _b64(data), "size": len(data),
            "mode": 0o644, "chunks": [blake(data)], "state": "ok"}


def _manifest(name: str = "pkg", version: str = "1.0", files: list | None = None) -> dict:
    return {"kind": "dist", "format": 1, "name": name, "version": version, "build_id": "b" * 64,
            "state_id": "b" * 64, "dist_info": f"{SP}/pkg-1.0.dist-info", "installer": "pip", "requested": True,
            "wheel": {"tags": ["py3-none-any"], "build": None, "generator": "x", "root_is_purelib": True},
            "direct_url": None, "record": "ok", "build_info": None, "scripts": None,
            "files": files if files is not None else [_file("pkg/__init__.py")]}


def _vault(tmp_path, man: dict, *, blob_index: bool = True, manifest_index: bool = True):
    """A vault holding one full snapshot of one package ``man``; the index files of its blob / manifest
    packs deleted on request (their packs stay). Returns ``(vault, snapshot id)``."""
    vault = init_vault(tmp_path / "vault")
    _pack, idx = write_pack(vault, [(PAYLOAD, "b")])
    if not blob_index:
        idx.unlink()
    mid = put_manifest(vault, man)
    if not manifest_index:
        for p in (vault / "index").iterdir():
            if mid in p.read_text():
                p.unlink()
    summary = {"name": man["name"], "version": man["version"], "build_id": man["build_id"],
               "state_id": man["state_id"], "identity": 2, "scripts": None, "manifest": mid, "installer": "pip",
               "requested": True, "record": "ok", "build_info": None, "files": len(man["files"]), "size": 10,
               "modified": [], "missing": [], "exec": []}
    sid = put_snapshot(vault, snapshot_doc(venv=str(tmp_path / "venv"), packages=[summary], lock_only=False,
                                           python=PYTHON))
    return vault, sid


def _export(tmp_path, vault, sid, *args):
    out = tmp_path / "out"
    rc, stdout, err = run_cli(["export", sid, "-o", out / "pylock.toml", *args], vault=vault)
    return rc, err, out


def _nothing_written(out) -> None:
    assert not out.exists() or sorted(os.listdir(out)) == [], sorted(os.listdir(out))


def test_the_crafted_vault_exports(tmp_path):
    """The baseline every attack below changes one thing of: it exports, wheel and lock."""
    vault, sid = _vault(tmp_path, _manifest())
    rc, err, out = _export(tmp_path, vault, sid)
    assert rc == 0, err
    assert sorted(os.listdir(out / "pylock.wheels")) == ["pkg-1.0-py3-none-any.whl"]


@pytest.mark.parametrize("hostile", ["abs", "dotdot"])
def test_hostile_manifest_name_is_refused(tmp_path, hostile):
    folder, state = decoy(tmp_path)
    before = state()
    name = str(folder / "x") if hostile == "abs" else "../../decoy/x"
    vault, sid = _vault(tmp_path, _manifest(name=name))
    rc, err, out = _export(tmp_path, vault, sid)
    one_line(rc, err, 3, "unsafe name")
    assert state() == before
    _nothing_written(out)
    assert not list(tmp_path.glob("**/x-1.0*"))


@pytest.mark.parametrize("version", ["1.0/../../../decoy/v", "/abs"])
def test_hostile_version_is_refused(tmp_path, version):
    vault, sid = _vault(tmp_path, _manifest(version=version))
    rc, err, out = _export(tmp_path, vault, sid)
    one_line(rc, err, 3, "unsafe version")
    _nothing_written(out)


@pytest.mark.parametrize("record,path,needle", [
    # refused by the manifest parser (envvault/model/manifest.py), the check every reader of a manifest gets
    ("pkg/../../escape.py", None, "files[1].record 'pkg/../../escape.py' contains '..'"),  # climbs out
    ("/abs/escape.py", f"{SP}/escape.py", "files[1].record '/abs/escape.py' is absolute"),  # absolute member
    ("../../../x", "../escape.py", "files[1].path '../escape.py' contains '..'"),  # leaves the prefix
    ("pkg\\..\\..\\escape.py", None, "contains a backslash"),  # a member a Windows unzip would split
    # well-formed paths, but not a wheel member: refused by export's own rule
    ("pkg//escape.py", f"{SP}/pkg/escape.py", "outside the wheel"),
])
def test_hostile_member_paths_are_refused(tmp_path, record, path, needle):
    vault, sid = _vault(tmp_path, _manifest(files=[_file("pkg/__init__.py"), _file(record, path)]))
    rc, err, out = _export(tmp_path, vault, sid)
    one_line(rc, err, 3, "refusing", needle)
    _nothing_written(out)


@pytest.mark.parametrize("lost", ["blob", "manifest"])
def test_missing_index_files_fail_export(tmp_path, lost):
    vault, sid = _vault(tmp_path, _manifest(), blob_index=lost != "blob", manifest_index=lost != "manifest")
    for args in ((), ("--no-wheels",) if lost == "manifest" else ()):
        rc, err, out = _export(tmp_path, vault, sid, *args)
        one_line(rc, err, 5, "envvault verify")
        _nothing_written(out)


def test_lock_only_export_of_a_hostile_stored_copy_leaves_no_wheels(tmp_path):
    """A lock-only snapshot is exported from the full snapshot's stored copies: the hostile one is refused
    (its manifest is parsed before any wheel is written), and no wheel folder is left half-filled."""
    good = {**_manifest(name="aaa"), "build_id": "a" * 64, "state_id": "a" * 64,
            "dist_info": f"{SP}/aaa-1.0.dist-info"}
    bad = _manifest(files=[_file("pkg/__init__.py"), _file("/abs/escape.py", f"{SP}/escape.py")])
    vault = init_vault(tmp_path / "vault")
    write_pack(vault, [(PAYLOAD, "b")])
    packages = []
    for man in (good, bad):
        mid = put_manifest(vault, man)
        packages.append({"name": man["name"], "version": man["version"], "build_id": man["build_id"],
                         "state_id": man["state_id"], "identity": 2, "scripts": None, "manifest": mid,
                         "installer": "pip", "requested": True, "record": "ok", "build_info": None, "files": 1,
                         "size": 10, "modified": [], "missing": [], "exec": []})
    venv = str(tmp_path / "venv")
    put_snapshot(vault, snapshot_doc(venv=venv, packages=packages, lock_only=False, python=PYTHON))
    lock = put_snapshot(vault, snapshot_doc(venv=venv, packages=packages, lock_only=True, python=PYTHON,
                                            created="2026-11-30T11:00:00.000000Z"))
    rc, err, out = _export(tmp_path, vault, lock)
    one_line(rc, err, 3, "refusing", "files[1].record '/abs/escape.py' is absolute")
    _nothing_written(out)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_export_never_replaces_a_link_or_a_node_at_its_output(tmp_path, kind):
    """``-o`` naming a symlink or a FIFO (``/dev/full`` as root, helper 31): the rename that writes the lockfile
    replaced the link or the node itself, and exit 0. Refused in one line (exit 2); the link, its target and
    the FIFO stay, and no wheel folder is made."""
    vault, sid = _vault(tmp_path, _manifest())
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "target.toml"
    target.write_text("kept")
    path = out / "pylock.toml"
    if kind == "symlink":
        path.symlink_to(target)
    else:
        os.mkfifo(path)
    rc, _stdout, err = run_cli(["export", sid, "-o", path], vault=vault)
    assert rc == 2 and "is a symlink or not a regular file" in err, err
    assert (path.is_symlink() and os.readlink(path) == str(target)) if kind == "symlink" else path.is_fifo()
    assert target.read_text() == "kept" and not (out / "pylock.wheels").exists()

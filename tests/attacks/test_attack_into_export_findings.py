"""Attack pass on ``restore SNAP --into NEW`` and ``export SNAP -o DIR/pylock.toml`` with a hostile vault.

Each test here failed on the code before this file's fixes (an attack pass of 2026-12-04): each demonstrated
one problem (code execution, a write outside the target, unbounded memory, or an internal error instead of
one clear line) and now checks its fix. The vault is a
real one (a uv venv holding a small wheel with a console script and a ``.data/scripts`` file, snapped by
envvault); the attack edits its snapshot document or its manifest and stores them again, as a stranger
sharing a vault could (ids stay valid: they are BLAKE3 of the edited bytes).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures import build_wheel, uv_install
from fixtures.trees import tree_state
from fixtures.venvs import make_venv
from tests.attacks.craft import one_line, run_cli
from tests.evtools import ev_json

PY = "3.11"
SP = f"lib/python{PY}/site-packages"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """``(vault, snapshot id, venv)``: a uv venv with ``tinypkg 1.0`` (console script ``tinycli``, data script
    ``tinyscript``), snapped. Tests copy the vault before editing it."""
    import sys

    if f"{sys.version_info[0]}.{sys.version_info[1]}" != PY:
        pytest.fail(f"these tests expect Python {PY} (site-packages paths)")
    tmp = tmp_path_factory.mktemp("intoexport")
    wheel = build_wheel(tmp / "w", "tinypkg", "1.0", {"tinypkg/__init__.py": b"X = 1\ndef main():\n    print(1)\n"},
                        console_scripts={"tinycli": "tinypkg:main"}, scripts={"tinyscript": b"#!python\nprint(2)\n"})
    venv = tmp / "venv"
    make_venv(venv, "uv")
    uv_install(venv, wheel)
    vault = tmp / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    return vault, sid, venv


def _forge(base, tmp_path, edit_doc=None, edit_man=None, blobs=(), *, raw_manifest=False):
    """A copy of the base vault with one more snapshot: the base one after ``edit_doc(doc)``, each package's
    manifest after ``edit_man(man)``. ``raw_manifest``: store the manifest as ASCII-escaped JSON (to carry
    lone surrogates, which canonical UTF-8 JSON cannot). Returns ``(vault, new snapshot id)``."""
    from envvault.model.encoding import canonical_json, object_id
    from envvault.vault.store import Vault

    src, sid, _venv = base
    vault_dir = tmp_path / "vault"
    shutil.copytree(src, vault_dir)
    vault = Vault.open(vault_dir)
    doc = json.loads(json.dumps(vault.load_snapshot(sid).doc))
    writer = vault.writer()
    for b in blobs:
        if not vault.has(object_id(b)) and not writer.queued(object_id(b)):
            writer.add(object_id(b), b, "b")
    for p in doc["packages"]:
        man = json.loads(json.dumps(vault.load_manifest(p["manifest"]).to_dict()))
        if edit_man is not None:
            man = edit_man(man) or man
        data = (json.dumps(man, sort_keys=True, separators=(",", ":")).encode() if raw_manifest
                else canonical_json(man))
        oid = object_id(data)
        if not vault.has(oid) and not writer.queued(oid):
            writer.add(oid, data, "m")
        p["manifest"] = oid
    writer.flush()
    writer.close()
    if edit_doc is not None:
        doc = edit_doc(doc) or doc
    doc["message"] = "hostile"
    return vault_dir, vault.commit_snapshot(doc)


def _into(vault, sid, dest, **kw):
    return run_cli(["restore", sid, "--into", dest], vault=vault, **kw)


def _export(vault, sid, out, *args, **kw):
    return run_cli(["export", sid, "-o", out, *args], vault=vault, **kw)


def _file(path: str, record: str, data: bytes, mode: int = 0o644) -> dict:
    from envvault.model.encoding import object_id

    return {"path": path, "record": record, "state": "ok", "sha256": _b64(data), "size": len(data), "mode": mode,
            "chunks": [object_id(data)]}


def _evil_python(folder: Path, marker: Path) -> None:
    """``folder/bin/python{,3,3.11}``: shell scripts that append to ``marker`` when run."""
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3", f"python{PY}"):
        exe = folder / "bin" / name
        exe.write_text(f"#!/bin/sh\necho ran \"$0\" >> {marker}\nexit 1\n")
        exe.chmod(0o755)


# -- 1. code execution: the snapshot's python facts choose which program envvault runs ---------------------


@pytest.mark.parametrize("how", ["base_prefix relative to the working folder", "base_prefix absolute",
                                 "version as a path"])
def test_into_never_runs_a_program_the_snapshot_names(base, tmp_path, how):
    """``restore --into`` looks for the snapshot's interpreter at ``<python.base_prefix>/bin/python3.X`` (then
    ``uv python find <python.version>``) and runs each candidate to ask its version (restore/uv.py
    ``find_python`` / ``_version_of``). Both fields come from the (hostile) snapshot, unchecked: a relative
    base_prefix runs ``./bin/python3.11`` of whatever folder the user is in (a cloned repository), an
    absolute one or a version that is a path runs any program at a chosen place."""
    marker = tmp_path / "ran.txt"
    repo = tmp_path / "repo"
    _evil_python(repo, marker)

    def edit(doc):
        if how.startswith("base_prefix relative"):
            doc["python"]["base_prefix"] = "."
        elif how == "base_prefix absolute":
            doc["python"]["base_prefix"] = str(repo)
        else:
            doc["python"]["base_prefix"] = None
            doc["python"]["version"] = str(repo / "bin" / "python3")

    vault, sid = _forge(base, tmp_path, edit_doc=edit)
    _into(vault, sid, tmp_path / "into", cwd=repo, timeout=120)
    assert not marker.exists(), f"envvault ran a program the vault chose: {marker.read_text()}"


@pytest.mark.parametrize("path", ["bin/python", "bin/python3"])
def test_into_never_runs_an_interpreter_from_the_vault(base, tmp_path, path):
    """A manifest file at ``bin/python`` (or ``bin/python3``): ``restore --into`` writes it over the interpreter
    link uv just made (materialize ``_stage_one`` with ``FINAL_NAME``: ``_fresh`` unlinks what is there), then
    its verification scan runs ``<new venv>/bin/python3 -I -S -c ...`` (env/probe.py): the vault's bytes run
    during the restore."""
    marker = tmp_path / "ran.txt"
    payload = f"#!/bin/sh\necho ran >> {marker}\nexit 1\n".encode()

    def edit(man):
        man["files"].append(_file(path, f"../../../{path}", payload, 0o755))

    vault, sid = _forge(base, tmp_path, edit_man=edit, blobs=[payload])
    _into(vault, sid, tmp_path / "into", timeout=120)
    assert not marker.exists(), "envvault executed a file from the vault during restore --into"


@pytest.mark.parametrize("path", ["bin/python3", "pyvenv.cfg"])
def test_an_in_place_restore_never_writes_the_interpreter_or_pyvenv_cfg(base, tmp_path, path):
    """The same manifests restored in place (onto a copy of the venv): refused before anything is written
    (safepaths.reserved_problem), the copy's interpreter link and pyvenv.cfg untouched, nothing run."""
    _vault, _sid, venv = base
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(venv), str(copy)], check=True)
    for gone in (copy / SP).glob("tinypkg*"):  # the package to restore: every file of its manifest is written
        shutil.rmtree(gone)
    marker = tmp_path / "ran.txt"
    payload = (f"#!/bin/sh\necho ran >> {marker}\nexit 1\n" if path.startswith("bin/")
               else "home = /tmp/elsewhere\n").encode()

    def edit(man):
        man["files"].append(_file(path, f"../../../{path}", payload, 0o755))

    vault, sid = _forge(base, tmp_path, edit_man=edit, blobs=[payload])
    before = tree_state(copy)
    rc, _out, err = run_cli(["restore", sid, "--venv", copy], vault=vault, timeout=120)
    one_line(rc, err, 3, "which no package installs")
    assert not marker.exists() and tree_state(copy) == before


# -- 2. a write outside the target: python.purelib names another environment ------------------------------


def test_lock_only_into_never_writes_outside_through_purelib(base, tmp_path):
    """A lock-only snapshot whose ``python.purelib`` is the absolute site-packages of another environment:
    after uv's install, ``restore --into`` looks for each dist-info at ``<dest>/<purelib>/<name>``
    (restore/installed.py ``find_dist_info``: ``dest / "/abs/..."`` is ``/abs/...``) and rewrites INSTALLER,
    REQUESTED, direct_url.json, uv_cache.json and RECORD there (into.py ``_apply_provenance``)."""
    _vault, _sid, venv = base
    victim = tmp_path / "victim"
    subprocess.run(["cp", "-a", str(venv), str(victim)], check=True)
    (victim / SP / "tinypkg-1.0.dist-info" / "direct_url.json").write_text('{"url": "file:///the/victims/own"}')
    before = tree_state(victim)

    def edit(doc):
        doc["lock_only"] = True
        doc["python"]["purelib"] = doc["python"]["platlib"] = str(victim / SP)
        doc["created"] = "2099-01-01T00:00:00.000000Z"

    vault, sid = _forge(base, tmp_path, edit_doc=edit)
    _into(vault, sid, tmp_path / "into", timeout=180)
    after = tree_state(victim)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert changed == [], f"restore --into wrote into another environment: {changed}"


# -- 3. memory: whole-file reads bounded only by the size the manifest claims -----------------------------

_BIG = b"\0" * (32 << 20)  # compresses to a few KiB: 40 copies in a chunk list name 1.3 GB
_COPIES = 40


def _claim_big(record: str, head: bytes = b""):
    from envvault.model.encoding import object_id

    h = hashlib.sha256(head)
    for _ in range(_COPIES):
        h.update(_BIG)
    sha = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()

    def edit(man):
        for f in man["files"]:
            if f["record"] == record:
                f["chunks"] = ([object_id(head)] if head else []) + [object_id(_BIG)] * _COPIES
                f["size"] = len(head) + _COPIES * len(_BIG)
                f["sha256"] = sha
                f["state"] = "ok"
    return edit


@pytest.mark.parametrize("command, record, head", [
    ("into", "tinypkg-1.0.dist-info/RECORD", b""),  # installed.stored_record -> materialize.stored_bytes
    ("into", "tinypkg-1.0.dist-info/INSTALLER", b""),  # into._wanted_provenance -> stored_bytes
    ("into", "../../../bin/tinyscript", b"#!/usr/bin/python\n#"),  # into._specs_of stored() of a script
    ("export", "tinypkg-1.0.dist-info/entry_points.txt", b""),  # wheels._console_scripts -> stored_bytes
])
def test_whole_file_reads_of_a_small_vault_are_bounded(base, tmp_path, command, record, head):
    """An 84 KiB vault: one file whose chunk list repeats a 32 MiB object 40 times and whose recorded size
    and sha256 say 1.3 GB. The files read whole into memory (RECORD, provenance files, scripts to rewrite,
    entry_points.txt) are bounded only by that claimed size (materialize.stored_bytes): under a 1 GiB
    address-space limit the command dies with ``internal error: MemoryError``. (The environment's own
    dist-info files are read with a 64 MiB limit: docs/format.md, "Threat model".)"""
    vault, sid = _forge(base, tmp_path, edit_man=_claim_big(record, head), blobs=[_BIG] + ([head] if head else []))
    if command == "into":
        rc, _out, err = _into(vault, sid, tmp_path / "into", timeout=300)
    else:
        rc, _out, err = _export(vault, sid, tmp_path / "out" / "pylock.toml", timeout=300)
    assert "MemoryError" not in err and "internal error" not in err, err
    assert rc != 0
    one_line(rc, err, rc)


# -- 4. safepaths.FinalTree on long paths and link targets ------------------------------------------------


def test_a_long_symlink_target_is_refused_in_bounded_memory(base, tmp_path):
    """One symlink whose 80 KB target has 40,000 components: ``FinalTree._walk`` joins and caches every prefix
    of it (``_kind("/".join(stack))`` / ``_disk``), quadratic in the target's length: 1.6 GB for one link,
    ``internal error: MemoryError`` under 1 GiB. A target longer than PATH_MAX can never be created anyway."""
    def edit(man):
        man["files"].append({"path": f"{SP}/lnk", "record": "lnk", "link": "a/" * 40000 + "b", "mode": 0o777,
                             "state": "ok"})

    vault, sid = _forge(base, tmp_path, edit_man=edit)
    rc, _out, err = _into(vault, sid, tmp_path / "into", timeout=120)
    assert "MemoryError" not in err and "internal error" not in err, err
    one_line(rc, err, rc)
    assert rc != 0


def test_a_deep_path_is_refused_not_a_recursion_error(base, tmp_path):
    """A file 3,000 folders deep: ``FinalTree._dir`` recurses once per component (safepaths.py), so the
    restore ends in ``internal error: RecursionError`` instead of one refusal."""
    data = b"x = 1\n"

    def edit(man):
        rel = "a/" * 3000 + "f.py"
        man["files"].append(_file(f"{SP}/{rel}", rel, data))

    vault, sid = _forge(base, tmp_path, edit_man=edit, blobs=[data])
    rc, _out, err = _into(vault, sid, tmp_path / "into", timeout=120)
    assert "RecursionError" not in err and "internal error" not in err, err
    one_line(rc, err, rc)
    assert rc != 0


# -- 5. malformed values: internal errors instead of one clear line ---------------------------------------


def _set_python(key, value):
    def edit(doc):
        doc["python"][key] = value
    return edit


def _set_pyvenv(key, value):
    def edit(doc):
        doc["python"]["pyvenv_cfg"][key] = value
    return edit


def _set_direct_url(du):
    def edit(man):
        man["direct_url"] = du
    return edit


def _add_entry(entry):
    def edit(man):
        man["files"].append(entry)
    return edit


_X = b"x = 1\n"

MALFORMED = {
    # restore/pyvenv.py pyvenv_wanted (was into.py _pyvenv_wanted): (value or "false").lower() on a non-string -> AttributeError
    "into: pyvenv_cfg include-system-site-packages is a number": ("into", _set_pyvenv("include-system-site-packages", 1), None, False),
    # export.py requires_python: version.split(".")[:2] unpacked into two -> ValueError / AttributeError
    "export: python.version '3'": ("export", _set_python("version", "3"), None, False),
    "export: python.version null": ("export", _set_python("version", None), None, False),
    # lone surrogates (valid escaped JSON, never written by envvault): UnicodeEncodeError where a path is used
    "into: a path with a lone surrogate": ("into", None, _add_entry(_file(f"{SP}/bad\ud800.py", "bad\ud800.py", _X)), True),
    "into: a link target with a lone surrogate": ("into", None, _add_entry(
        {"path": f"{SP}/lnk", "record": "lnk", "link": "x\ud800", "mode": 0o777, "state": "ok"}), True),
    "export: a RECORD path with a lone surrogate": ("export", None, _add_entry(_file(f"{SP}/bad.py", "bad\ud800.py", _X)), True),
    "export: a path with an escaped non-UTF-8 byte": ("export", None, _add_entry(_file(f"{SP}/b\udcff.py", "b\udcff.py", _X)), True),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_documents_give_one_clear_line(base, tmp_path, case):
    command, edit_doc, edit_man, raw = MALFORMED[case]
    vault, sid = _forge(base, tmp_path, edit_doc=edit_doc, edit_man=edit_man, blobs=[_X], raw_manifest=raw)
    if command == "into":
        rc, _out, err = _into(vault, sid, tmp_path / "into", timeout=120)
    else:
        rc, _out, err = _export(vault, sid, tmp_path / "out" / "pylock.toml", timeout=120)
    assert "internal error" not in err and "Traceback" not in err, err
    assert rc != 0, err
    one_line(rc, err, rc)


@pytest.mark.parametrize("archive_info", [{"hashes": ["sha256"]}, {"hash": 5}, {"hashes": {"sha256": 5}}])
def test_a_malformed_archive_info_is_taken_as_absent(base, tmp_path, archive_info):
    """``direct_url.json`` is the installer's document (PEP 610): hashes that are not a table of texts, or a
    ``hash`` that is not a text, are no hashes (lock/sources.py ``original_source``), never an internal error
    (before: ``dict(list)`` raised ValueError, ``'=' in 5`` TypeError)."""
    vault, sid = _forge(base, tmp_path, edit_man=_set_direct_url({"url": "file:///tmp/x.whl",
                                                                  "archive_info": archive_info}))
    rc, _out, err = _export(vault, sid, tmp_path / "out" / "pylock.toml", timeout=120)
    assert rc == 0 and "internal error" not in err and "Traceback" not in err, err
    assert "hashes" not in (tmp_path / "out" / "pylock.toml").read_text().split("file:///tmp/x.whl")[-1][:200]


# -- 6. smaller ones ----------------------------------------------------------------------------------------


def test_into_pyvenv_prompt_cannot_add_lines_to_pyvenv_cfg(base, tmp_path):
    """``pyvenv_cfg.prompt`` holding newlines is written as is (restore/pyvenv.py ``apply_settings``): the vault adds any
    key it likes to the new venv's pyvenv.cfg (here a second ``home`` and ``include-system-site-packages``)."""
    vault, sid = _forge(base, tmp_path, edit_doc=_set_pyvenv(
        "prompt", "x\nhome = /tmp/elsewhere/bin\ninclude-system-site-packages = true"))
    into = tmp_path / "into"
    rc, _out, err = _into(vault, sid, into, timeout=120)
    assert rc != 0 and "pyvenv.cfg prompt is not a one-line text" in err, err
    one_line(rc, err, rc)
    assert not into.exists()  # refused before the venv was made


def test_export_never_writes_a_wheel_with_duplicate_members(base, tmp_path):
    """Two manifest entries with one RECORD path: export writes both as members of one name (zipfile prints a
    ``UserWarning: Duplicate name`` with its source line on stderr) and exits 0 with an ambiguous wheel."""
    def edit(man):
        man["files"] += [_file(f"{SP}/zz.py", "zz.py", _X), _file(f"{SP}/zz.py", "zz.py", _X)]

    vault, sid = _forge(base, tmp_path, edit_man=edit, blobs=[_X])
    out = tmp_path / "out" / "pylock.toml"
    rc, _o, err = _export(vault, sid, out, timeout=120)
    assert "Warning" not in err and "names the wheel member" in err and "twice" in err, err
    one_line(rc, err, rc)
    assert rc != 0 and not list(out.parent.glob("**/*.whl"))


def test_export_requirements_cannot_gain_lines_from_a_package_name(base, tmp_path):
    """A package summary named ``tinypkg\\n--index-url http://evil/simple``: ``--format requirements`` writes
    the name as is (export.py ``requirement_line``), adding an option line to the requirements file; the
    summary's name is never checked (only a rebuilt wheel's manifest name is)."""
    def edit(doc):
        doc["packages"][0]["name"] = "tinypkg\n--index-url http://evil/simple\n#"

    vault, sid = _forge(base, tmp_path, edit_doc=edit)
    out = tmp_path / "req.txt"
    rc, _o, err = _export(vault, sid, out, "--format", "requirements", timeout=120)
    assert rc != 0 and "a requirements file can hold" in err, err
    one_line(rc, err, rc)
    assert not out.exists()


def test_lock_only_export_refused_leaves_no_wheel_in_an_existing_folder(tmp_path):
    """A lock-only export whose second stored copy is refused: the wheel of the first was already written
    (lock/sources.py ``pylock_entries`` checks each manifest only in ``rebuild_wheel``, one after the other,
    not before anything is written), and export.py removes only a wheel folder it created, so in an existing
    ``pylock.wheels/`` the first wheel stays (docs/format.md, "Export": a failure removes the wheels this export
    wrote, a lock-only snapshot's too)."""
    from tests.attacks.craft import init_vault, put_manifest, put_snapshot, snapshot_doc, write_pack
    from tests.attacks.test_export_attacks import PAYLOAD, PYTHON, SP as XSP, _file as xfile, _manifest

    good = {**_manifest(name="aaa"), "build_id": "a" * 64, "state_id": "a" * 64, "dist_info": f"{XSP}/aaa-1.0.dist-info"}
    bad = _manifest(files=[xfile("pkg/__init__.py"), xfile("pkg//x.py", f"{XSP}/pkg/x.py")])
    vault = init_vault(tmp_path / "vault")
    write_pack(vault, [(PAYLOAD, "b")])
    packages = []
    for man in (good, bad):
        packages.append({"name": man["name"], "version": man["version"], "build_id": man["build_id"],
                         "state_id": man["state_id"], "identity": 2, "scripts": None,
                         "manifest": put_manifest(vault, man), "installer": "pip", "requested": True, "record": "ok",
                         "build_info": None, "files": 1, "size": 10, "modified": [], "missing": [], "exec": []})
    venv = str(tmp_path / "venv")
    put_snapshot(vault, snapshot_doc(venv=venv, packages=packages, lock_only=False, python=PYTHON))
    lock = put_snapshot(vault, snapshot_doc(venv=venv, packages=packages, lock_only=True, python=PYTHON,
                                            created="2026-11-30T11:00:00.000000Z"))
    wheels = tmp_path / "out" / "pylock.wheels"
    wheels.mkdir(parents=True)
    (wheels / "mine.txt").write_text("the user's\n")
    rc, _o, err = run_cli(["export", lock, "-o", tmp_path / "out" / "pylock.toml"], vault=vault)
    one_line(rc, err, 3, "refusing")
    assert sorted(os.listdir(wheels)) == ["mine.txt"]

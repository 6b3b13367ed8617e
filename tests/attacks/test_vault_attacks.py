"""Hostile vaults against the vault commands (list, show, tag, untag, verify, gc, snap): issue 14, items 2, 3, 6,
7 and 8. Every vault here is crafted from docs/format.md alone (tests/attacks/craft.py).

Each attack asserts: nothing outside the vault changed (the tree hash of a decoy folder), the run stayed
within 1 GiB of address space and a timeout (prlimit), one clean line on stderr and the documented exit code
(docs/cli.md).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.attacks.craft import (blake, decoy, init_vault, one_line, put_blob, put_manifest, put_raw_snapshot,
                                 put_snapshot, put_tag, run_cli, snapshot_doc, tree_hash, write_pack)


@pytest.fixture
def box(tmp_path):
    """``(vault, good snapshot id, decoy folder, decoy state function)``: a crafted vault holding one good
    snapshot (one package, its manifest and blob stored) tagged ``good``, and a decoy folder beside it."""
    vault = init_vault(tmp_path / "vault")
    blob = put_blob(vault, b"print('hi')\n")
    mid = put_manifest(vault, {"kind": "dist", "format": 1, "name": "demo", "version": "1.0", "build_id": "b" * 64,
                               "state_id": "b" * 64, "files": [{"path": "demo.py", "record": "demo.py",
                                                                 "chunks": [blob], "size": 12, "mode": 0o644,
                                                                 "state": "ok"}]})
    pkg = {"name": "demo", "version": "1.0", "build_id": "b" * 64, "state_id": "b" * 64, "manifest": mid,
           "files": 1, "size": 12, "modified": [], "missing": []}
    sid = put_snapshot(vault, snapshot_doc(packages=[pkg], lock_only=False))
    put_tag(vault, "good", sid)
    root, state = decoy(tmp_path)
    return vault, sid, root, state


def _vault_state(vault: Path) -> str:
    """The vault's data (not locks/, whose lock files any command creates, nor the caches in state/)."""
    return " ".join(tree_hash(vault / d) for d in ("packs", "index", "snapshots", "tags")) + tree_hash(vault / "config.json")


# -- 14.2: untag deletes any file ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ABS", "../config.json", "../../decoy/keep.txt", "latest", "deadbeef", ".hidden",
                                  "a/b", "x" * 129, "good\n"])
def test_untag_refuses_what_is_not_a_tag_name(box, name):
    vault, _sid, root, state = box
    if name == "ABS":
        name = str(root / "keep.txt")
    before, before_vault = state(), _vault_state(vault)
    rc, _out, err = run_cli(["untag", name], vault=vault, timeout=20)
    one_line(rc, err, 2, "bad tag name")
    assert state() == before and _vault_state(vault) == before_vault


@pytest.mark.parametrize("name", ["../evil", "/tmp/evil-tag", "latest", "abcd1234", "-x"])
def test_tag_refuses_what_is_not_a_tag_name(box, name):
    vault, sid, root, state = box
    before, before_vault = state(), _vault_state(vault)
    rc, _out, err = run_cli(["tag", sid[:12], "--", name] if name.startswith("-") else ["tag", sid[:12], name],
                            vault=vault, timeout=20)
    one_line(rc, err, 2, "bad tag name")
    assert state() == before and _vault_state(vault) == before_vault
    assert not os.path.lexists("/tmp/evil-tag")


def test_untag_of_a_valid_tag_still_works(box):
    vault, sid, _root, state = box
    before = state()
    rc, out, err = run_cli(["tag", sid[:8], "release-1.0_b"], vault=vault, timeout=20)
    assert rc == 0, err
    assert (vault / "tags" / "release-1.0_b").read_text() == sid + "\n"
    rc, out, err = run_cli(["untag", "release-1.0_b"], vault=vault, timeout=20)
    assert rc == 0 and "removed tag release-1.0_b" in out, err
    assert not (vault / "tags" / "release-1.0_b").exists() and (vault / "tags" / "good").exists()
    rc, _out, err = run_cli(["untag", "release-1.0_b"], vault=vault, timeout=20)
    one_line(rc, err, 4, "no tag")
    assert state() == before


def test_bad_entries_in_tags_are_skipped_not_resolved(box, tmp_path):
    """A file in tags/ whose name is not a tag name is never taken as a tag (resolve, list, gc)."""
    vault, sid, root, state = box
    put_tag(vault, "has space", sid)
    put_tag(vault, "latest", sid)
    before = state()
    rc, out, err = run_cli(["list", "--json"], vault=vault, timeout=20)
    assert rc == 0 and '"good"' in out and "has space" not in out, err
    assert "tags/has space" in err and "tags/latest" in err
    rc, _out, err = run_cli(["show", "has space"], vault=vault, timeout=20)
    assert rc == 4, err
    assert state() == before


def test_list_of_a_good_vault_still_works(box):
    vault, sid, _root, state = box
    before = state()
    rc, out, err = run_cli(["list", "--json"], vault=vault, timeout=20)
    assert rc == 0 and err == "", err
    assert sid in out and '"good"' in out
    rc, out, err = run_cli(["verify"], vault=vault, timeout=20)
    assert rc == 0 and "ok" in out, err
    rc, out, err = run_cli(["gc", "--keep-last", "1", "--json"], vault=vault, timeout=20)
    assert rc == 0 and err == "", err
    assert state() == before


# -- 14.3: gc and snap follow symlinks inside the vault -------------------------------------------------------


def _link_entry(vault: Path, entry: str, target: Path) -> None:
    """Replace the vault's ``entry`` (a top-level folder, ``packs/<aa>`` or a file) with a link to ``target``,
    keeping what it held (copied into ``target``) so only the link differs."""
    path = vault / entry
    if path.is_dir():
        for child in path.iterdir():
            os.rename(child, target / child.name)
        path.rmdir()
    elif path.exists():
        path.unlink()
    os.symlink(target, path)


@pytest.mark.parametrize("entry", ["packs", "index", "locks", "snapshots", "tags", "state", "tmp", "packs/aa",
                                   "config.json", "settings.json"])
@pytest.mark.parametrize("command", [["gc", "--keep-last", "0"], ["list"]])
def test_links_inside_the_vault_are_refused(box, entry, command):
    vault, _sid, root, state = box
    if entry == "packs/aa":
        (vault / "packs" / "aa").mkdir()
    if entry in ("config.json", "settings.json"):
        target = root / entry
    else:
        target = root / "sub"
        (target / f"{'x' * 64}.pack").write_bytes(b"not a pack")  # gc would delete an unindexed pack
        old = target / "old.tmp"
        old.write_bytes(b"old")
        os.utime(old, (1_000_000_000, 1_000_000_000))  # gc deletes old temp files
    _link_entry(vault, entry, target)
    before = state()
    rc, _out, err = run_cli(command, vault=vault, timeout=20)
    one_line(rc, err, 3, str(vault / entry), "is a symlink")
    assert state() == before


def test_gc_epoch_linked_outside_is_not_written(box):
    vault, _sid, root, state = box
    os.symlink(root / "keep.txt", vault / "state" / "gc-epoch")
    before = state()
    rc, _out, err = run_cli(["gc"], vault=vault, timeout=20)
    one_line(rc, err, 3, "gc-epoch", "is a symlink")
    assert state() == before


def test_lock_file_linked_outside_is_not_opened(box):
    vault, _sid, root, state = box
    os.symlink(root / "created-by-lock", vault / "locks" / "vault.lock")
    before = state()
    rc, _out, err = run_cli(["gc"], vault=vault, timeout=20)
    one_line(rc, err, 3, "vault.lock", "is a symlink")
    assert state() == before and not os.path.lexists(root / "created-by-lock")


def test_links_inside_tmp_are_removed_not_followed(box):
    """gc deletes old temp files: a link there goes, what it points to stays."""
    vault, _sid, root, state = box
    link = vault / "tmp" / ".x.1.ab.tmp"
    os.symlink(root / "old.tmp", link)
    os.utime(link, (1_000_000_000, 1_000_000_000), follow_symlinks=False)
    before = state()
    rc, _out, err = run_cli(["gc"], vault=vault, timeout=20)
    assert rc == 0, err
    assert state() == before and not os.path.lexists(link)


def test_vault_root_may_be_a_symlink(box, tmp_path):
    vault, sid, _root, state = box
    alias = tmp_path / "alias"
    os.symlink(vault, alias)
    rc, out, err = run_cli(["list", "--json"], vault=alias, timeout=20)
    assert rc == 0 and sid in out, err
    rc, _out, err = run_cli(["gc"], vault=alias, timeout=20)
    assert rc == 0, err


def test_cache_snap_into_a_vault_with_linked_packs_is_refused(box, tmp_path):
    """A writer (here `cache snap`, which needs no venv) refuses before writing a pack through the link."""
    vault, _sid, root, state = box
    _link_entry(vault, "packs", root / "sub")
    cache = tmp_path / "mycache"
    cache.mkdir()
    (cache / "k.bin").write_bytes(os.urandom(2048))
    before = state()
    rc, _out, err = run_cli(["cache", "snap", "--no-discover", "--cache-dir", cache], vault=vault, timeout=30)
    one_line(rc, err, 3, "packs", "is a symlink")
    assert state() == before


# -- 14.6: creating a vault changes an existing directory ------------------------------------------------------


def _cache_snap(vault: Path, tmp_path: Path) -> tuple[int, str, str]:
    cache = tmp_path / "c"
    cache.mkdir(exist_ok=True)
    (cache / "f").write_text("x")
    return run_cli(["--vault", vault, "cache", "snap", "--no-discover", "--cache-dir", cache], timeout=30)


@pytest.mark.parametrize("with_config", [False, True])
def test_vault_is_not_made_in_a_non_empty_folder(tmp_path, with_config):
    """A shared 1777 folder holding other files (and perhaps another program's config.json) is refused whole."""
    shared, state = decoy(tmp_path, "team")
    if not with_config:
        (shared / "config.json").unlink()
    os.chmod(shared, 0o1777)
    before = state()
    rc, _out, err = _cache_snap(shared, tmp_path)
    one_line(rc, err, 2, str(shared), "not an envvault vault")
    assert state() == before
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777


def test_vault_in_an_empty_shared_folder_keeps_its_mode(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    rc, _out, err = _cache_snap(shared, tmp_path)
    assert rc == 0, err
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(shared / "packs").st_mode) == 0o700
    new = tmp_path / "new" / "vault"
    rc, _out, err = _cache_snap(new, tmp_path)
    assert rc == 0, err
    assert stat.S_IMODE(os.stat(new).st_mode) == 0o700
    rc, _out, err = _cache_snap(new, tmp_path)  # an existing vault is used, not refused
    assert rc == 0, err


# -- 14.7: one badly shaped snapshot breaks the whole vault -------------------------------------------------------


BAD_SHAPES = {
    "format-string": ({"format": "1"}, "format: expected an integer"),
    "packages-string": ({"packages": "x"}, "packages: expected a list"),
    "created-int": ({"created": 12345}, "created: expected a string"),
    "build-id": ({"packages": [{"name": "a", "version": "1", "build_id": "zz", "state_id": "a" * 64,
                                "manifest": "a" * 64}]}, "packages[0].build_id: expected a 64-hex string"),
    "not-object": (None, "expected a JSON object"),
}


@pytest.mark.parametrize("shape", sorted(BAD_SHAPES))
def test_malformed_snapshot_is_skipped_by_readers_and_named_by_verify(box, shape):
    vault, sid, root, state = box
    over, problem = BAD_SHAPES[shape]
    bad = put_raw_snapshot(vault, b"[1,2]") if over is None else put_snapshot(vault, snapshot_doc(**over))
    before, before_vault = state(), _vault_state(vault)

    rc, out, err = run_cli(["list", "--json"], vault=vault, timeout=20)
    assert rc == 0 and sid in out and bad not in out, err
    assert one_line(0, err, 0, bad[:12], problem).startswith("envvault: warning:")

    rc, out, err = run_cli(["verify"], vault=vault, timeout=20)
    assert rc == 5 and bad[:12] in out and problem in out, (out, err)

    rc, _out, err = run_cli(["show", bad[:12]], vault=vault, timeout=20)
    one_line(rc, err, 5, bad[:12], problem)

    for gc in (["gc"], ["gc", "--keep-last", "0"]):
        rc, _out, err = run_cli(gc, vault=vault, timeout=20)
        assert rc == 5 and "gc stops" in err and bad[:12] in err and problem in err, err
        assert "Traceback" not in err
    assert state() == before and _vault_state(vault) == before_vault


def test_snapshot_of_a_newer_format_is_refused_not_malformed(box):
    vault, _sid, _root, _state = box
    newer = put_snapshot(vault, {"format": 2, "whatever": True})
    rc, _out, err = run_cli(["show", newer[:12]], vault=vault, timeout=20)
    one_line(rc, err, 2, "newer envvault")


# -- 14.8: unbounded reads under tags/ and snapshots/ ------------------------------------------------------------


def test_fifo_in_tags_does_not_hang(box):
    vault, sid, _root, state = box
    os.mkfifo(vault / "tags" / "stuck")
    before = state()
    rc, out, err = run_cli(["list", "--json"], vault=vault, timeout=15)
    assert rc == 0 and sid in out and "tags/stuck" in err, err
    rc, _out, err = run_cli(["show", "stuck"], vault=vault, timeout=15)
    assert rc == 4 and "TIMEOUT" not in err, err
    rc, _out, err = run_cli(["show", "good"], vault=vault, timeout=15)
    assert rc == 0, err
    assert state() == before


@pytest.mark.parametrize("where", ["tag", "snapshot", "index"])
def test_links_to_dev_zero_are_not_read(box, where):
    vault, sid, _root, state = box
    if where == "tag":
        os.symlink("/dev/zero", vault / "tags" / "zero")
    elif where == "snapshot":
        os.symlink("/dev/zero", vault / "snapshots" / f"{'c' * 64}.json")
    else:
        os.symlink("/dev/zero", vault / "index" / f"{'c' * 64}.idx")
    before = state()
    for command in (["list", "--json"], ["show", "good"]):
        rc, out, err = run_cli(command, vault=vault, timeout=15, memory=1 << 30)
        assert rc == 0 and sid in out, (command, err)
    rc, out, err = run_cli(["verify"], vault=vault, timeout=15, memory=1 << 30)
    assert rc == (5 if where == "snapshot" else 0), (out, err)
    assert state() == before


def test_fifo_as_snapshot_and_index_does_not_hang(box):
    vault, sid, _root, state = box
    os.mkfifo(vault / "snapshots" / f"{'d' * 64}.json")
    os.mkfifo(vault / "index" / f"{'d' * 64}.idx")
    before = state()
    rc, out, err = run_cli(["list", "--json"], vault=vault, timeout=15)
    assert rc == 0 and sid in out and "not a regular file" in err, err
    rc, out, err = run_cli(["verify"], vault=vault, timeout=15)
    assert rc == 5 and "d" * 12 in out, (out, err)
    assert state() == before


def test_index_claiming_a_huge_frame_is_refused_without_reading(box):
    """An index may say anything: a frame of 4 GiB is refused before a byte is read (bounded memory)."""
    vault, _sid, _root, state = box
    data = b"y" * 100
    pack_id, idx = write_pack(vault, [data])
    idx.write_text(json.dumps({"format": 1, "pack": pack_id, "frames": [[8, 1 << 32]],
                               "objects": {blake(data): [0, 0, 100, "b"]}}))
    mid = put_manifest(vault, {"kind": "dist", "format": 1, "name": "big", "version": "1", "build_id": "c" * 64,
                               "state_id": "c" * 64, "files": [{"path": "x", "record": "x", "chunks": [blake(data)],
                                                                 "size": 100, "mode": 420, "state": "ok"}]})
    pkg = {"name": "big", "version": "1", "build_id": "c" * 64, "state_id": "c" * 64, "manifest": mid}
    bad = put_snapshot(vault, snapshot_doc(packages=[pkg], created="2026-11-30T11:00:00.000000Z"))
    before = state()
    rc, out, err = run_cli(["verify"], vault=vault, timeout=15, memory=1 << 30)
    assert rc == 5 and "refused" in out and bad[:12] in out, (out, err)
    assert state() == before


# -- the same against a real environment: status and snap ----------------------------------------------------


@pytest.fixture(scope="module")
def real_venv(tmp_path_factory):
    from fixtures import make_venv

    return make_venv(tmp_path_factory.mktemp("real") / "venv", "uv")


def test_status_skips_a_malformed_snapshot(tmp_path, real_venv):
    vault = tmp_path / "vault"
    rc, out, err = run_cli(["snap", "--no-caches", "--venv", real_venv, "--json"], vault=vault, timeout=60)
    assert rc == 0, err
    bad = put_snapshot(vault, snapshot_doc(venv=str(real_venv), packages="x"))
    rc, out, err = run_cli(["status", "--venv", real_venv, "--json"], vault=vault, timeout=60)
    assert rc == 0, err
    assert one_line(0, err, 0, bad[:12], "packages: expected a list").startswith("envvault: warning:")


@pytest.mark.parametrize("entry", ["index", "packs"])
def test_snap_into_a_vault_with_a_linked_folder_is_refused(tmp_path, real_venv, entry):
    vault = tmp_path / "vault"
    rc, _out, err = run_cli(["snap", "--no-caches", "--venv", real_venv], vault=vault, timeout=60)
    assert rc == 0, err
    root, state = decoy(tmp_path)
    _link_entry(vault, entry, root / "sub")
    before = state()
    rc, _out, err = run_cli(["snap", "--no-caches", "--venv", real_venv, "-m", "again"], vault=vault, timeout=60)
    one_line(rc, err, 3, str(vault / entry), "is a symlink")
    assert state() == before


DEEP = b"[" * 200_000 + b"]" * 200_000  # past the interpreter's recursion limit: json.loads raises RecursionError


def test_json_nested_past_the_recursion_limit_is_bad_json(box):
    """An index, settings.json and a snapshot nested 200,000 deep: each is damaged JSON, never an internal
    error. list and status-like readers go on (the bad snapshot skipped, the bad index's objects absent);
    verify names the snapshot (exit 5)."""
    vault, sid, _root, state = box
    (vault / "index" / f"{'e' * 64}.idx").write_bytes(DEEP)
    (vault / "settings.json").write_bytes(DEEP)
    deep_sid = put_raw_snapshot(vault, DEEP)
    before = state()
    rc, out, err = run_cli(["list", "--json"], vault=vault, timeout=30)
    assert rc == 0 and sid in out and "internal error" not in err, err
    rc, out, err = run_cli(["verify"], vault=vault, timeout=30)
    assert rc == 5 and deep_sid[:12] in out and "internal error" not in err, (out, err)
    rc, out, err = run_cli(["show", deep_sid[:12]], vault=vault, timeout=30)
    one_line(rc, err, 5, "not valid JSON")
    assert state() == before


def test_sync_streams_packs_and_refuses_one_that_does_not_match_its_name(box, tmp_path):
    """``sync`` copies a pack in 8 MiB steps while hashing it (never whole in memory); a pack whose bytes do
    not match its name is refused in one line (exit 5) and nothing of it reaches the destination."""
    vault, _sid, _root, state = box
    pack = next((vault / "packs").rglob("*.pack"))
    data = bytearray(pack.read_bytes())
    data[-1] ^= 0xFF
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))
    dst = tmp_path / "copy"
    rc, _out, err = run_cli(["sync", str(vault), str(dst)], vault=vault, timeout=30)
    one_line(rc, err, 5, "does not match its name")
    assert not (dst / "packs" / pack.parent.name / pack.name).exists()  # (the good pack may be there: harmless)
    assert not [p for p in dst.rglob("*") if p.name.startswith(".sync-")]


def test_texts_of_a_snapshot_are_printed_with_control_characters_escaped(tmp_path, make_venv):
    """A snapshot may be anyone's: its message (or venv, host, env values) printed raw by ``list`` and ``show``
    split lines and, on a terminal, let escape sequences through (BEL, cursor moves, title sets). Printed now
    with control characters escaped, one line each; ``--json`` keeps the text exact."""
    from tests.evtools import ev, ev_json

    venv = make_venv("uv")
    vault = tmp_path / "vault"
    message = "fast\nrun\x07\x1b]0;pwned\x07"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv, "-m", message)["id"]
    listed = ev(vault, "list").stdout
    assert listed.count("\n") == 1 and "\x07" not in listed and "\x1b" not in listed, listed
    assert "fast\\nrun\\x07\\x1b]0;pwned\\x07" in listed, listed
    shown = ev(vault, "show", sid).stdout
    assert "\x07" not in shown and "\x1b" not in shown and "created" in shown.splitlines()[1], shown
    assert ev_json(vault, "show", sid)["message"] == message
    # A variable a snapshot recorded (CUDA_HOME) with the same characters, through ``diff``'s env rows.
    from tests.evtools import ev_env

    other = ev_json(vault, "snap", "--no-caches", "--venv", venv, env=ev_env(vault, CUDA_HOME="/x\x1b]0;pwned\x07\nFAKE"))
    text = ev(vault, "diff", sid, other["id"]).stdout
    assert "\x07" not in text and "\x1b" not in text and "\nFAKE" not in text, text
    assert "CUDA_HOME=/x\\x1b]0;pwned\\x07\\nFAKE" in text, text

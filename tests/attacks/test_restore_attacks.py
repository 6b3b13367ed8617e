"""Hostile vaults against `restore` and `cache restore --to`: symlink chains, links through links, links
already on disk, and the restore lock reached through a symlink (issue 14, items 1 and 4).

Each manifest is written from docs/format.md alone (a package manifest, or a cache tree manifest) into a
real vault, next to a real venv. Every attack asserts: nothing changed in the venv (or cache root) or in a
decoy folder beside it (before/after tree state), one clean line on stderr, exit code 3 (refused).
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
from pathlib import Path

import pytest

from fixtures.trees import forge_snapshot, tree_state
from tests.attacks.craft import ROOT
from tests.evtools import assert_one_line_error, ev, ev_json

SP = f"lib/python3.{sys.version_info[1]}/site-packages"  # the uv venvs of make_venv use this Python


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _link(path: str, target: str) -> dict:
    return {"path": path, "record": path, "link": target, "mode": 0o777, "state": "ok"}


def _file(path: str, data: bytes) -> dict:
    from envvault.model.encoding import object_id

    return {"path": path, "record": path, "sha256": _b64(data), "size": len(data), "mode": 0o644,
            "chunks": [object_id(data)], "state": "ok"}


def _forge_package(vault_path: Path, base_sid: str, files: list[dict]) -> str:
    """Commit a snapshot of the base one holding a single package ``evil 1.0`` made of ``files``."""
    from envvault.model.encoding import object_id
    from envvault.vault.store import Vault

    vault = Vault.open(vault_path)
    payload = b"owned\n"
    files = [_file(f"{SP}/evil/__init__.py", payload)] + files  # a good file first: it must not land either
    man = {"kind": "dist", "format": 1, "name": "evil", "version": "1.0", "build_id": "e" * 64, "state_id": "e" * 64,
           "dist_info": f"{SP}/evil-1.0.dist-info", "installer": "pip", "requested": True, "wheel": {},
           "direct_url": None, "record": "ok", "build_info": None, "files": files}
    return forge_snapshot(vault, vault.load_snapshot(base_sid).doc, [man], {object_id(payload): payload})


@pytest.fixture
def box(tmp_path, make_venv):
    """``(vault, venv, decoy, base snapshot id)``: a venv and a decoy folder side by side."""
    venv = make_venv("uv", name="venv")
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "keep.txt").write_text("decoy\n")
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    return vault, venv, decoy, sid


def _links_leading_out(root: Path) -> list[str]:
    real = os.path.realpath(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                dest = os.path.realpath(full)
                if dest != real and not dest.startswith(real + os.sep):
                    out.append(os.path.relpath(full, root))
    return out


def _assert_refused(proc, before_venv, before_decoy, venv: Path, decoy: Path, *needles: str) -> None:
    assert_one_line_error(proc, "refusing", *needles)
    assert proc.returncode == 3
    assert tree_state(venv) == before_venv  # nothing written, not even a journal
    assert tree_state(decoy) == before_decoy


ENV_ATTACKS = {
    # issue 14.1 as filed: hop leads to the venv's root (inside); out then climbs four folders above it
    # (/etc for a venv two levels deep). Read as text, out stays inside (hop/.. cancels).
    "chain to /etc": [_link(f"{SP}/hop", "../../.."), _link(f"{SP}/out", "hop/../../../../etc")],
    # the same chain, one level up only: a sibling of the venv (the decoy)
    "chain to a sibling": [_link(f"{SP}/hop", "../../.."), _link(f"{SP}/sib", "hop/../decoy")],
    # a chain of three links, each inside on its own
    "three hops": [_link(f"{SP}/a", "../../.."), _link(f"{SP}/b", "a/lib"), _link(f"{SP}/c", "b/../../decoy")],
    # a file written through a link the same manifest creates
    "file under its own link": [_link(f"{SP}/hop", "../../.."), _file(f"{SP}/hop/planted.py", b"x")],
    # going up out of a folder that does not exist: dangling today, out once a later restore creates it
    "up out of a missing folder": [_link(f"{SP}/out", "later/../../../../decoy")],
    # a link to itself through another: never resolves, refused rather than followed forever
    "loop": [_link(f"{SP}/l1", "l2/x"), _link(f"{SP}/l2", "l1/y")],
}


@pytest.mark.parametrize("case", sorted(ENV_ATTACKS))
def test_env_restore_refuses_symlinks_that_lead_out_of_the_final_tree(box, case):
    vault, venv, decoy, sid = box
    evil = _forge_package(vault, sid, ENV_ATTACKS[case])
    before_venv, before_decoy = tree_state(venv), tree_state(decoy)
    proc = ev(vault, "restore", evil, "--venv", venv, "--no-backup", check=False)
    _assert_refused(proc, before_venv, before_decoy, venv, decoy)
    # --dry-run refuses the same way (it prints the plan the restore would follow)
    dry = ev(vault, "restore", evil, "--venv", venv, "--dry-run", check=False)
    _assert_refused(dry, before_venv, before_decoy, venv, decoy)


def test_a_link_already_on_disk_turned_outward_is_refused(box):
    """``x -> d/../../../..`` is inside while ``d`` is a folder; a restore that turns ``d`` into a link to the
    venv's root would make ``x`` lead out."""
    vault, venv, decoy, sid = box
    site = venv / SP
    (site / "d").mkdir()
    os.symlink("d/../../../..", site / "x")  # today: the venv's root
    assert os.path.realpath(site / "x") == os.path.realpath(venv)
    evil = _forge_package(vault, sid, [_link(f"{SP}/d", "../../..")])
    before_venv, before_decoy = tree_state(venv), tree_state(decoy)
    proc = ev(vault, "restore", evil, "--venv", venv, "--no-backup", check=False)
    _assert_refused(proc, before_venv, before_decoy, venv, decoy, "already there")


def test_links_that_stay_inside_are_restored(box):
    """The rule refuses only what leads out: chains inside the venv are restored and verified."""
    vault, venv, decoy, sid = box
    files = [_link(f"{SP}/hop", "../../.."), _link(f"{SP}/cfg", "hop/pyvenv.cfg"),
             _link(f"{SP}/evil/alias.py", "__init__.py")]
    good = _forge_package(vault, sid, files)
    before_decoy = tree_state(decoy)
    # (not "verified": the forged package has no dist-info, so the scan cannot see it installed)
    proc = ev(vault, "restore", good, "--venv", venv, "--no-backup", check=False)
    assert "refusing" not in proc.stderr and proc.returncode == 1, proc.stderr
    assert os.path.realpath(venv / SP / "cfg") == os.path.realpath(venv / "pyvenv.cfg")
    assert (venv / SP / "evil" / "alias.py").read_bytes() == b"owned\n"
    new_links = [p for p in _links_leading_out(venv) if p.startswith(SP)]
    assert new_links == []
    assert tree_state(decoy) == before_decoy


# -- cache restore --to ----------------------------------------------------------------------------


def _cache_snapshot(vault_dir: Path, files: list[dict], blobs: list[bytes], root: Path) -> str:
    from envvault.model.encoding import canonical_json, object_id
    from envvault.vault.store import Vault

    vault = Vault.open(vault_dir, create=True)
    writer = vault.writer()
    for data in blobs:
        writer.add(object_id(data), data)
    manifest = {"format": 1, "kind": "cache", "cache_kind": "user", "root": str(root), "fingerprint": None,
                "files": files}
    data = canonical_json(manifest)
    writer.add(object_id(data), data, "m")
    writer.flush()
    writer.close()
    doc = {"format": 1, "kind": "cache-snapshot", "created": "2026-11-29T00:00:00.000000Z", "message": "hostile",
           "trigger": "cache-snap", "argv": ["envvault", "cache", "snap"], "venv": None, "lock_only": False,
           "python": dict.fromkeys(("implementation", "version", "abi", "soabi", "platform")),
           "host": {}, "env": {}, "packages": [], "fingerprint": None, "warnings": [],
           "caches": [{"kind": "user", "root": str(root), "manifest": object_id(data), "files": len(files),
                       "bytes": 0, "fingerprint": None, "warnings": []}]}
    return vault.commit_snapshot(doc)


def _cfile(path: str, data: bytes) -> dict:
    from envvault.model.encoding import object_id

    return {"path": path, "size": len(data), "mode": 0o644, "sha256": _b64(data), "chunks": [object_id(data)]}


def _clink(path: str, target: str) -> dict:
    return {"path": path, "link": target, "mode": 0o777}


CACHE_ATTACKS = {
    "chain to a sibling": [_clink("a/hop", ".."), _clink("a/out", "hop/../decoy")],
    "chain to /etc": [_clink("a/hop", ".."), _clink("a/out", "hop/../../etc")],
    "three hops": [_clink("x/a", ".."), _clink("x/b", "a/x"), _clink("x/c", "b/../../decoy")],
    "up out of a missing folder": [_clink("out", "later/../x")],
}


@pytest.mark.parametrize("case", sorted(CACHE_ATTACKS))
def test_cache_restore_to_refuses_symlinks_that_lead_out_of_the_final_tree(tmp_path, case):
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "keep.txt").write_text("decoy\n")
    root = tmp_path / "root"
    root.mkdir()
    (root / "present").write_text("already here\n")
    files = [_cfile("good/first", b"good")] + CACHE_ATTACKS[case]
    sid = _cache_snapshot(tmp_path / "vault", files, [b"good"], tmp_path / "archived")
    before_root, before_decoy = tree_state(root), tree_state(decoy)
    for mode in ("--merge", "--replace"):
        proc = ev(tmp_path / "vault", "cache", "restore", sid, "--to", root, mode, check=False)
        _assert_refused(proc, before_root, before_decoy, root, decoy)


def test_cache_link_chain_inside_the_root_is_restored(tmp_path):
    root = tmp_path / "root"
    files = [_cfile("good/first", b"good"), _clink("a/hop", ".."), _clink("a/alias", "hop/good/first")]
    sid = _cache_snapshot(tmp_path / "vault", files, [b"good"], tmp_path / "archived")
    ev_json(tmp_path / "vault", "cache", "restore", sid, "--to", root)
    assert (root / "a" / "alias").read_bytes() == b"good"
    assert _links_leading_out(root) == []


# -- the restore lock, reached through a symlink (14.4) -------------------------------------------


def test_restore_lock_is_keyed_on_the_real_path(box, tmp_path):
    """A restore through a symlink to the venv waits for (is refused by) one running on the venv itself."""
    from envvault.journal import exclusive_target
    from envvault.vault.store import Vault

    vault, venv, decoy, sid = box
    alias = tmp_path / "alias"
    alias.symlink_to(venv)
    before = tree_state(venv)
    with exclusive_target(Vault.open(vault), venv):  # a restore of the venv, by its own path, holds the lock
        proc = ev(vault, "restore", sid, "--venv", alias, "--no-backup", check=False)
    assert_one_line_error(proc, "another envvault restore")
    assert proc.returncode == 3
    assert tree_state(venv) == before
    # and once it is released, the restore through the symlink runs
    assert ev_json(vault, "restore", sid, "--venv", alias, "--no-backup")["verified"]


def test_restored_marker_and_stat_cache_are_keyed_on_the_real_path(box, tmp_path):
    """Restored through a symlink, the environment is the same one for `status` by its own path."""
    from fixtures import build_wheel, uv_install

    vault, venv, decoy, empty = box
    uv_install(venv, build_wheel(tmp_path / "w", "keyedpkg", "1.0", {"keyedpkg/__init__.py": b"X = 1\n"}))
    newer = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]  # the newest snapshot: with keyedpkg
    alias = tmp_path / "alias"
    alias.symlink_to(venv)
    assert ev_json(vault, "restore", empty, "--venv", alias, "--no-backup")["verified"]  # keyedpkg removed
    status = ev_json(vault, "status", "--venv", venv)
    assert status["snapshot"] == empty and status["empty"] is True, status
    assert newer != empty


# -- the rule itself, case by case (envvault.safepaths.FinalTree) ---------------------------------

RULE_CASES = [
    # (links the restore creates, files it writes, {path: expected verdict: None = allowed, else a word of it})
    ({"a/hop": "..", "a/out": "hop/a/x"}, [], {"a/out": None}),
    ({"a/hop": "..", "a/out": "hop/../x"}, [], {"a/out": "leads outside"}),
    ({"a/hop": "..", "a/out": "hop/.."}, [], {"a/out": "leads outside"}),
    ({"a/l": "b"}, ["a/l/f"], {"a/l/f": "symlink this restore creates"}),
    ({"a/l": "../d/f"}, ["d/f"], {"a/l": None}),
    ({"a/l": "ghost/../x"}, [], {"a/l": "not a folder"}),
    ({"a/l": "f/../x"}, ["a/f"], {"a/l": "not a folder"}),
    ({"l1": "l2", "l2": "l1"}, [], {"l1": "too many levels"}),
    ({"l": "/etc"}, [], {"l": "absolute"}),
]


def test_final_tree_rule_case_by_case(tmp_path):
    from envvault.safepaths import FinalTree

    for links, files, expect in RULE_CASES:
        root = tmp_path / f"case{RULE_CASES.index((links, files, expect))}"
        root.mkdir()
        tree = FinalTree(root, links=links, entries=files)
        for path, want in expect.items():
            got = tree.link_problem(path, links[path]) if path in links else tree.write_problem(path)
            if want is None:
                assert got is None, (links, path, got)
            else:
                assert got is not None and want in got, (links, path, got)


def test_final_tree_follows_links_already_on_disk(tmp_path):
    from envvault.safepaths import FinalTree

    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    os.symlink("..", root / "up")  # on disk: leads out
    os.symlink(str(root / "d"), root / "abs-in")  # absolute, inside
    tree = FinalTree(root, links={"x": "abs-in/../d", "y": "up/root/d"}, entries=["up/f", "abs-in/f"])
    assert tree.link_problem("x", "abs-in/../d") is None
    assert "leads outside" in tree.link_problem("y", "up/root/d")  # out and back in: still refused
    assert "leads outside" in tree.write_problem("up/f")
    assert tree.write_problem("abs-in/f") is None


# -- hostile manifests against lock-only restores, --into, journals, caches (attack round 2) -------------------


def _dist(name: str, files: list[dict], **over) -> dict:
    man = {"kind": "dist", "format": 1, "name": name, "version": "1.0", "build_id": "e" * 64, "state_id": "e" * 64,
           "dist_info": f"{SP}/{name}-1.0.dist-info", "installer": "pip", "requested": True, "wheel": {},
           "direct_url": None, "record": "ok", "build_info": None, "files": files}
    man.update(over)
    return man


def _forge(vault_path: Path, base_sid: str, mans: list[dict], blobs: list[bytes]) -> str:
    from envvault.model.encoding import object_id
    from envvault.vault.store import Vault

    vault = Vault.open(vault_path)
    return forge_snapshot(vault, vault.load_snapshot(base_sid).doc, mans, {object_id(b): b for b in blobs})


@pytest.mark.parametrize("where", ["outside", "pyvenv.cfg"])
def test_lock_only_restore_never_unlinks_a_missing_file_outside_the_environment(box, tmp_path, where):
    """A stored "edited" copy whose missing file's RECORD path climbs out of site-packages: re-applying the
    snapshot's state (installed.reapply_state) must not delete the file it names outside the venv, nor the
    venv's own pyvenv.cfg, which the RECORD just installed does not list (helper 32, 2)."""
    import json

    from envvault.vault.store import Vault

    vault, venv, decoy, sid = box
    victim = decoy / "keep.txt" if where == "outside" else venv / "pyvenv.cfg"
    kept = victim.read_bytes()
    rec_row = "../" * 16 + str(victim).lstrip("/") if where == "outside" else "../../../pyvenv.cfg"
    init, meta = b"X = 1\n", b"Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n"
    wheel = b"Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = (f"evil/__init__.py,sha256={_b64(init)},{len(init)}\n"
              f"evil-1.0.dist-info/METADATA,sha256={_b64(meta)},{len(meta)}\n"
              f"evil-1.0.dist-info/WHEEL,sha256={_b64(wheel)},{len(wheel)}\n"
              f"{rec_row},sha256=AAAA,1\nevil-1.0.dist-info/RECORD,,\n").encode()
    di = f"{SP}/evil-1.0.dist-info"

    def f(path, rec, data, **kw):
        return {**_file(path, data), "record": rec, **kw}

    files = [f(f"{SP}/evil/__init__.py", "evil/__init__.py", init),
             f(f"{di}/METADATA", "evil-1.0.dist-info/METADATA", meta),
             f(f"{di}/WHEEL", "evil-1.0.dist-info/WHEEL", wheel),
             f(f"{di}/RECORD", "evil-1.0.dist-info/RECORD", record, state="unhashed"),
             {"path": "victim.txt", "record": rec_row, "state": "missing", "sha256": "AAAA", "size": 1}]
    man = _dist("evil", files, wheel={"tags": ["py3-none-any"], "root_is_purelib": True, "build": None,
                                       "generator": "x"})
    full = _forge(vault, sid, [man], [init, meta, wheel, record])
    v = Vault.open(vault)
    doc = json.loads(json.dumps(v.load_snapshot(full).doc))
    doc["packages"][0]["missing"] = ["victim.txt"]  # the stored copy is "edited": its state is re-applied
    doc["message"] = "edited copy"
    v.commit_snapshot(doc)
    (Path(vault) / "snapshots" / f"{full}.json").unlink()  # only the edited copy stays
    lock = v.commit_snapshot(dict(doc, lock_only=True, message="lock-only"))
    before_decoy = tree_state(decoy)
    proc = ev(vault, "restore", lock, "--venv", venv, "--no-backup", check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert victim.read_bytes() == kept
    assert tree_state(decoy) == before_decoy
    proc = ev(vault, "restore", lock, "--into", tmp_path / "into", check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert tree_state(decoy) == before_decoy


def test_cache_root_with_dotdot_is_refused_not_trusted(tmp_path):
    """``<trusted cache dir>/../decoy`` reads as inside the trusted dir but is not: the manifest's root must be
    normalised (model/cache.py), and the trust test compares real paths (caches/restore.py ``_trusted``)."""
    from envvault.model.encoding import canonical_json, object_id
    from envvault.vault.store import Vault
    from tests.evtools import ev_env

    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "keep.txt").write_text("decoy\n")
    ic = tmp_path / "inductor"
    ic.mkdir()
    root = f"{ic}/../decoy"
    payload = b"planted\n"
    vault = Vault.open(tmp_path / "vault", create=True)
    writer = vault.writer()
    writer.add(object_id(payload), payload)
    man = canonical_json({"format": 1, "kind": "cache", "cache_kind": "inductor", "root": root, "fingerprint": None,
                          "files": [_cfile("authorized_keys", payload)]})
    writer.add(object_id(man), man, "m")
    writer.flush()
    writer.close()
    sid = vault.commit_snapshot({
        "format": 1, "kind": "cache-snapshot", "created": "2026-11-29T00:00:00.000000Z", "message": "hostile",
        "trigger": "cache-snap", "argv": ["envvault", "cache", "snap"], "venv": None, "lock_only": False,
        "python": dict.fromkeys(("implementation", "version", "abi", "soabi", "platform")), "host": {}, "env": {},
        "packages": [], "fingerprint": None, "warnings": [],
        "caches": [{"kind": "inductor", "root": root, "manifest": object_id(man), "files": 1, "bytes": 0,
                    "fingerprint": None, "warnings": []}]})
    before_decoy, before_ic = tree_state(decoy), tree_state(ic)
    env = {**ev_env(tmp_path / "vault"), "TORCHINDUCTOR_CACHE_DIR": str(ic)}
    proc = ev(tmp_path / "vault", "cache", "restore", sid, env=env, check=False)
    assert_one_line_error(proc, "refusing", "root", "not a normalised")
    assert proc.returncode == 3
    assert tree_state(decoy) == before_decoy and tree_state(ic) == before_ic


def test_cache_root_trust_compares_real_paths():
    from envvault.caches.restore import _trusted

    assert not _trusted("/tmp/ic/../etc", {"/tmp/ic"})
    assert _trusted("/tmp/ic/sub", {"/tmp/ic"})


def test_a_hostile_dist_info_is_never_journalled_nor_removed_by_recovery(box):
    """``dist_info: "lib"``: a restore that fails after its journal is written must not leave the next scan
    (``status``) removing ``lib`` (journal.recover removes only a journalled ``*.dist-info`` folder)."""
    vault, venv, decoy, sid = box
    pkg = venv / SP / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("precious = 1\n")
    payload = b"x = 1\n"
    files = [_file(f"{SP}/evil/__init__.py", payload),
             _file(f"lib/python3.{sys.version_info[1]}", b"blocker")]  # a file where a folder is: the commit fails
    evil = _forge(vault, sid, [_dist("evil", files, dist_info="lib")], [payload, b"blocker"])
    proc = ev(vault, "restore", evil, "--venv", venv, "--no-backup", check=False)
    assert_one_line_error(proc, "non-empty directory")
    before_decoy = tree_state(decoy)
    proc = ev(vault, "status", "--venv", venv, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert (pkg / "__init__.py").read_text() == "precious = 1\n"
    assert (venv / "pyvenv.cfg").exists() and (venv / "bin" / "python").exists()
    assert tree_state(decoy) == before_decoy


def test_recover_removes_only_dist_info_folders(tmp_path):
    from envvault.journal import recover
    from envvault.model.journal import Journal

    target = tmp_path / "env"
    (target / "lib" / "site" / "half-1.0.dist-info").mkdir(parents=True)
    (target / "lib" / "site" / "pkg").mkdir()
    (target / "lib" / "site" / "pkg" / "x.py").write_text("x\n")
    recover(target, Journal(snapshot="0" * 64, dist_infos=("lib", "lib/site/pkg", "lib/site/half-1.0.dist-info")))
    assert (target / "lib" / "site" / "pkg" / "x.py").exists()
    assert not (target / "lib" / "site" / "half-1.0.dist-info").exists()


def test_into_removes_the_new_venv_when_its_verification_fails(box, tmp_path):
    """A stored METADATA the scan cannot read: the verification after ``--into`` fails, and the half-built
    venv goes with it (a rerun is not refused as "already an environment")."""
    vault, venv, decoy, sid = box
    di = f"{SP}/evil-1.0.dist-info"
    meta = b"\xff\xfe\x00garbage"
    record = f"evil-1.0.dist-info/METADATA,sha256={_b64(meta)},{len(meta)}\nevil-1.0.dist-info/RECORD,,\n".encode()
    files = [{**_file(f"{di}/METADATA", meta), "record": "evil-1.0.dist-info/METADATA"},
             {**_file(f"{di}/RECORD", record), "record": "evil-1.0.dist-info/RECORD", "state": "unhashed"}]
    evil = _forge(vault, sid, [_dist("evil", files)], [meta, record])
    into = tmp_path / "into"
    for _ in range(2):
        proc = ev(vault, "restore", evil, "--into", into, check=False)
        assert_one_line_error(proc, "garbled")
        assert proc.returncode == 7
        assert not into.exists()


_BIG = b"\0" * (32 << 20)  # compresses to a few KiB: repeated in a chunk list, a small vault names GiBs


@pytest.mark.parametrize("name, copies, needle", [("RECORD", 40, "evil 1.0"), ("BIG", 8, "(evil)")])
def test_into_refuses_a_stored_file_larger_than_recorded(box, tmp_path, name, copies, needle):
    """A file recorded as 10 bytes whose chunk list repeats a 32 MiB object: refused (exit 5) as soon as the
    chunks pass the recorded size, under a 1 GiB address-space limit. RECORD is joined in memory (no 1.3 GB
    join); any other file is staged on disk (no gigabytes written)."""
    from tests.attacks.craft import one_line, run_cli

    vault, venv, decoy, sid = box
    entry = {"path": f"{SP}/evil-1.0.dist-info/{name}", "record": f"evil-1.0.dist-info/{name}", "sha256": None,
             "size": 10, "mode": 0o644, "chunks": [_blake(_BIG)] * copies, "state": "unhashed"}
    evil = _forge(vault, sid, [_dist("evil", [entry])], [_BIG])
    into = tmp_path / "into"
    rc, _out, err = run_cli(["restore", evil, "--into", into], vault=vault, timeout=120)
    one_line(rc, err, 5, needle, "more than the 10 bytes recorded")
    assert not into.exists()


def test_stored_bytes_stops_at_the_recorded_size():
    from envvault.errors import CorruptError
    from envvault.materialize import stored_bytes
    from envvault.model.manifest import FileEntry

    class Reader:
        calls = 0

        def get(self, oid):
            Reader.calls += 1
            return memoryview(b"x" * 8)

    f = FileEntry(path="p/RECORD", record="RECORD", size=10, chunks=("a" * 64,) * 1000)
    with pytest.raises(CorruptError, match="more than the 10 bytes"):
        stored_bytes(Reader(), f, "pkg 1.0")
    assert Reader.calls == 2
    assert stored_bytes(Reader(), FileEntry(path="p", record="p", size=16, chunks=("a" * 64,) * 2)) == b"x" * 16


def test_materialize_stops_writing_once_past_the_recorded_size(tmp_path):
    """A file recorded as 10 bytes whose chunks repeat a 32 MiB object 60 times: staging stops at the first
    chunk past the size (no 2 GB written from a few KiB of vault)."""
    from envvault import materialize
    from envvault.errors import CorruptError

    class Reader:
        calls = 0

        def get(self, oid):
            Reader.calls += 1
            return memoryview(b"\0" * (1 << 20))

        def locate(self, oid, refresh=True):
            return None  # where it lies does not matter here

    spec = materialize.FileSpec("big", ("a" * 64,) * 60, 10, None, 0o644, None, "evil")
    with pytest.raises(CorruptError, match="more than the 10 bytes recorded"):
        materialize.stage(Reader(), tmp_path, [spec], materialize.FINAL_NAME, workers=1)
    assert Reader.calls == 1
    assert not (tmp_path / "big").exists()


def test_into_refuses_a_stored_record_that_is_not_utf8(box, tmp_path):
    vault, venv, decoy, sid = box
    bad = b"\xff\xfe not utf-8\n"
    rec = {**_file(f"{SP}/evil-1.0.dist-info/RECORD", bad), "record": "evil-1.0.dist-info/RECORD", "state": "unhashed"}
    evil = _forge(vault, sid, [_dist("evil", [rec])], [bad])
    into = tmp_path / "into"
    proc = ev(vault, "restore", evil, "--into", into, check=False)
    assert_one_line_error(proc, "evil 1.0", "not UTF-8")
    assert proc.returncode == 5
    assert not into.exists()


def _blake(data: bytes) -> str:
    from envvault.model.encoding import object_id

    return object_id(data)


def test_into_refuses_a_hostile_manifest_that_a_forked_child_reads(box, tmp_path):
    """``restore --into`` reads the manifests and decides the files in forked children when the venv is large
    (restore/into.py ``_plan_all``), here forced for six small distributions on four cores: a manifest path
    that climbs out refuses the restore as it does in one process, in one line, with no venv made and nothing
    written outside; no child is left."""
    import subprocess

    from envvault.model.encoding import object_id
    from envvault.vault.store import Vault

    vault, venv, decoy, sid = box
    payload = b"owned\n"
    mans = [_dist(f"good{i}", [_file(f"{SP}/good{i}/__init__.py", payload)]) for i in range(5)]
    climb = "../" * 12 + str(decoy / "pwned.txt").lstrip("/")
    mans.append(_dist("evil", [_file(f"{SP}/evil/__init__.py", payload), _file(climb, payload)]))
    v = Vault.open(vault)
    evil = forge_snapshot(v, v.load_snapshot(sid).doc, mans, {object_id(payload): payload})
    before = tree_state(decoy)
    into = tmp_path / "into"
    code = ("import atexit, os, sys\n"
            "os.sched_getaffinity = lambda pid: {0, 1, 2, 3}\n"
            "from envvault.vault import forked\n"
            "forked.FORK_MIN_WEIGHT = 1\n"
            "forked._WEIGHT_A_CHILD = 1\n"
            "forks, real = [], os.fork\n"
            "os.fork = lambda: forks.append(1) or real()\n"
            "atexit.register(lambda: os.getpid() == me and print(f'forks {len(forks)}', flush=True))\n"
            "me = os.getpid()\n"
            "from envvault.entry import main\n"
            "sys.argv = ['envvault', 'restore', sys.argv[1], '--into', sys.argv[2]]\n"
            "main()\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), ENVVAULT_HOME=str(vault))
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([sys.executable, "-c", code, evil, str(into)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "refusing" in proc.stderr and "'..'" in proc.stderr, proc.stderr
    assert int(proc.stdout.split("forks ")[1]) >= 1, proc.stdout
    assert not into.exists() and tree_state(decoy) == before


def test_a_missing_row_deletes_only_what_an_installed_distribution_lists(box):
    """A crafted manifest whose rows say "missing" for the venv's ``pyvenv.cfg``, its ``bin/python3`` and a
    user's file: the restore deleted all three (the plan took every missing row as a file to delete), and the
    venv no longer ran (helper 30, F3). A missing row now deletes only a file an installed distribution's
    RECORD lists; the rest stays."""
    vault, venv, _decoy, sid = box
    mine = venv / SP / "notes.txt"
    mine.write_text("mine")
    assert (venv / "bin" / "python3").is_symlink()  # (uv's venv: links to the interpreter)
    cfg, python = (venv / "pyvenv.cfg").read_bytes(), os.readlink(venv / "bin" / "python3")
    gone = [{"path": p, "record": p, "state": "missing"} for p in ("pyvenv.cfg", "bin/python3", f"{SP}/notes.txt")]
    forged = _forge_package(vault, sid, gone)
    proc = ev(vault, "restore", forged, "--venv", venv, "--json", check=False)
    assert proc.returncode in (0, 1), proc.stderr
    assert mine.read_text() == "mine"
    assert (venv / "pyvenv.cfg").read_bytes() == cfg
    assert os.readlink(venv / "bin" / "python3") == python


def test_a_journal_listing_the_venvs_own_files_deletes_none_of_them(box):
    """A restore journal left in the venv (``.envvault-restore.json``; a venv copied from someone else may
    carry one) whose ``removals`` name ``pyvenv.cfg`` and ``bin/python3``: the next restore deleted them with
    the rest of a killed restore's work. The venv's own interpreter and pyvenv.cfg are never deleted."""
    import json

    vault, venv, _decoy, sid = box
    cfg, python = (venv / "pyvenv.cfg").read_bytes(), os.readlink(venv / "bin" / "python3")
    (venv / ".envvault-restore.json").write_text(json.dumps({
        "format": 1, "snapshot": sid, "backup": None, "pid": 2 ** 22 + 11, "started": "2026-12-07T00:00:00Z",
        "staging_dirs": [], "removals": ["pyvenv.cfg", "bin/python3"], "writes": [], "dist_infos": [],
        "protected": []}))
    proc = ev(vault, "restore", sid, "--venv", venv, "--json", check=False)
    assert proc.returncode == 0, proc.stderr
    assert (venv / "pyvenv.cfg").read_bytes() == cfg and os.readlink(venv / "bin" / "python3") == python
    assert not (venv / ".envvault-restore.json").exists()

"""envvault cache snap / restore / list / diff on real trees, through the real CLI.

The H200 tree (shared/data) is a real Inductor root; its fingerprint is compared with the real CPU torch
of the ``torch_venv`` fixture (read from its files, torch is not imported). Hostile manifests are written
into a real vault with the vault's own writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import zstandard

from envvault.model.encoding import canonical_json, object_id
from envvault.model.record import record_sha256
from envvault.vault.store import Vault
from tests.evtools import assert_one_line_error, ev, ev_env, ev_json, mounted
from fixtures.machine import H200_CACHE_TAR

H200_TAR = H200_CACHE_TAR


def _extract_h200(dest: Path) -> Path:
    assert H200_TAR.is_file(), f"missing {H200_TAR}"
    dest.mkdir(parents=True, exist_ok=True)
    with open(H200_TAR, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(dest, filter="fully_trusted")
    return dest / "torchinductor_root"


def tree(root: Path) -> dict[str, tuple]:
    """Everything under ``root``: path -> (kind, mode, content digest or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = p.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", None, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", None, None)
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _clean_env(vault: Path, tmp: Path, **extra: str) -> dict:
    """An environment whose discovered caches all lie under ``tmp`` (none of the machine's real ones)."""
    env = {k: v for k, v in ev_env(vault).items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(TMPDIR=str(tmp / "t"), TORCHINDUCTOR_CACHE_DIR=str(tmp / "ic"), TRITON_CACHE_DIR=str(tmp / "tc"),
               TORCH_EXTENSIONS_DIR=str(tmp / "ext"), CUDA_CACHE_PATH=str(tmp / "nv"))
    (tmp / "t").mkdir(parents=True, exist_ok=True)
    env.update(extra)
    return env


def _small_cache(root: Path) -> Path:
    """A small tree laid out like an Inductor root, with what a snap must leave out."""
    files = {
        "fxgraph/ab/fabc/entry1": b"graph one" * 100,
        "fxgraph/cd/fcde/entry2": b"graph two" * 100,
        "aotautograd/aaa/entry": b"aot" * 50,
        "xy/cxy.py": b"print('kernel')\n",
        "xy/cxy.so": os.urandom(3000),
        "triton/0/HASH/kernel.cubin": os.urandom(2000),
        "triton/0/HASH/__grp__kernel.json": b'{"child_paths": {}}',
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    os.chmod(root / "xy/cxy.so", 0o755)
    os.chmod(root / "aotautograd/aaa/entry", 0o600)
    (root / "locks").mkdir()
    (root / "locks" / "cxy.lock").write_bytes(b"")
    (root / "fxgraph/ab/fabc/.entry1.123.456.tmp").write_bytes(b"half")
    (root / "triton/0/tmp.pid_12_0b0e7a8e-5d2c-4f8f-9d3e-0a1b2c3d4e5f").mkdir()
    (root / "empty").mkdir()
    os.symlink("cxy.py", root / "xy" / "latest.py")
    return root


# -- the real H200 tree ---------------------------------------------------------------------------


def test_h200_tree_round_trips_and_names_the_torch_mismatch(tmp_path, torch_venv):
    root = _extract_h200(tmp_path / "a")
    reference = tree(_extract_h200(tmp_path / "ref"))
    assert len([v for v in reference.values() if v[0] == "file"]) == 671
    vault = tmp_path / "vault"
    out = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root, "-m", "h200")
    (entry,) = out["caches"]
    assert entry["files"] == 671 and entry["bytes"] > 38_000_000 and entry["warnings"] == []
    assert entry["fingerprint"]["torch"]["version"] == "2.11.0+cu130"
    assert entry["entries"]["fxgraph"] >= 4 and entry["entries"]["triton"] > 50
    # One zstd stream of the tar is 3.6 MB: the vault must stay close to it.
    assert out["new_bytes"] < 1.2 * H200_TAR.stat().st_size
    assert ev_json(vault, "verify")["ok"] is True

    shutil.rmtree(root)
    # The archived root is not one of this environment's cache directories: nothing without consent.
    refused = ev_json(vault, "cache", "restore", out["id"][:8], "--venv", torch_venv)
    assert refused["caches"] == [] and refused["skipped"][0]["root"] == str(root) and not root.exists()
    assert any("--archived-roots" in w for w in refused["warnings"])
    done = ev_json(vault, "cache", "restore", out["id"][:8], "--venv", torch_venv, "--archived-roots")
    (restored,) = done["caches"]
    assert restored["root"] == str(root) and restored["written_files"] == 671
    assert tree(root) == reference  # bytes, modes, folders
    components = {m["component"]: m["message"] for m in restored["mismatches"]}
    assert components["torch"] == (
        "built by torch 2.11.0+cu130 on NVIDIA H200; this environment has torch 2.13.0+cpu: Inductor will not use it"
    )
    assert {"triton", "gpu", "python"} <= components.keys()
    text = ev(vault, "cache", "restore", out["id"][:8], "--venv", torch_venv, "--to", tmp_path / "b")
    assert "warning: user cache" in text.stderr and "this environment has torch 2.13.0+cpu" in text.stderr
    assert tree(tmp_path / "b") == reference


def test_unchanged_cache_is_reused_and_a_change_is_seen(tmp_path):
    root = _small_cache(tmp_path / "c")
    vault = tmp_path / "vault"
    first = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)["caches"][0]
    again = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
    assert again["caches"][0]["reused"] is True and again["new_objects"] == 0
    assert again["caches"][0]["manifest"] == first["manifest"]
    (root / "fxgraph/cd/fcde/entry2").write_bytes(b"graph two, recompiled")
    (root / "xy" / "new.py").write_bytes(b"new kernel")
    out = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
    changed = out["caches"][0]
    assert changed["reused"] is False and changed["manifest"] != first["manifest"]
    shutil.rmtree(root)
    ev(vault, "cache", "restore", out["id"], "--archived-roots")
    assert (root / "fxgraph/cd/fcde/entry2").read_bytes() == b"graph two, recompiled"
    assert (root / "xy" / "new.py").read_bytes() == b"new kernel"


def test_locks_and_files_being_written_are_left_out(tmp_path):
    root = _small_cache(tmp_path / "c")
    vault = tmp_path / "vault"
    out = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
    man = Vault.open(vault).get_json(out["caches"][0]["manifest"])
    paths = {f["path"]: f for f in man["files"]}
    assert "locks" in paths and paths["locks"]["dir"] is True
    assert not any(p.startswith("locks/") or p.endswith(".tmp") or "tmp.pid_" in p for p in paths)
    assert paths["xy/latest.py"]["link"] == "cxy.py" and paths["empty"]["dir"] is True
    assert paths["xy/cxy.so"]["mode"] == 0o755 and paths["aotautograd/aaa/entry"]["mode"] == 0o600
    before = tree(root)
    shutil.rmtree(root)
    ev(vault, "cache", "restore", out["id"], "--to", root)
    after = tree(root)
    dropped = {k for k in before if k.startswith("locks/") or k.endswith(".tmp") or "tmp.pid_" in k}
    assert after == {k: v for k, v in before.items() if k not in dropped}
    assert (root / "locks").is_dir() and not any((root / "locks").iterdir())


# -- merge and replace ------------------------------------------------------------------------------


def test_merge_never_overwrites_and_replace_restores_exactly(tmp_path):
    root = _small_cache(tmp_path / "c")
    vault = tmp_path / "vault"
    sid = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)["id"]
    archived = tree(root)
    (root / "fxgraph/ab/fabc/entry1").write_bytes(b"a newer graph")  # changed since
    (root / "aotautograd/aaa/entry").unlink()  # lost
    (root / "xy/other.py").write_bytes(b"compiled later")  # added since
    os.chmod(root / "xy/cxy.so", 0o700)  # mode changed
    (root / "xy/.cxy.py.99.1.tmp").write_bytes(b"being written")  # a compile writing now

    merged = ev_json(vault, "cache", "restore", sid, "--archived-roots")["caches"][0]
    assert merged["mode"] == "merge" and merged["written_files"] == 1
    assert (root / "aotautograd/aaa/entry").read_bytes() == b"aot" * 50
    assert (root / "fxgraph/ab/fabc/entry1").read_bytes() == b"a newer graph"
    assert (root / "xy/other.py").exists() and stat.S_IMODE((root / "xy/cxy.so").stat().st_mode) == 0o700

    dry = ev_json(vault, "cache", "restore", sid, "--replace", "--dry-run", "--to", root)["caches"][0]
    assert dry["dry_run"] is True and dry["removed_files"] == 1 and dry["written_files"] == 2
    assert (root / "xy/other.py").exists()
    replaced = ev_json(vault, "cache", "restore", sid, "--replace", "--to", root)["caches"][0]
    assert replaced["written_files"] == 2 and replaced["removed_files"] == 1
    now = tree(root)
    assert now.pop("xy/.cxy.py.99.1.tmp")[0] == "file"  # files being written are left alone
    assert now == archived
    assert not [p for p in root.rglob("*envvault*")]  # no staging file left


# -- hostile manifests ------------------------------------------------------------------------------


def _hostile_vault(vault_dir: Path, files: list[dict], blobs: list[bytes], root: Path) -> str:
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
           "venv": None, "packages": [], "python": {}, "lock_only": False,
           "caches": [{"kind": "user", "root": str(root), "manifest": object_id(data), "files": len(files),
                       "bytes": 0, "fingerprint": None, "warnings": []}]}
    return vault.commit_snapshot(doc)


def _file(path: str, data: bytes, **extra) -> dict:
    return {"path": path, "size": len(data), "mode": 0o644, "sha256": record_sha256(hashlib.sha256(data).digest()),
            "chunks": [object_id(data)], **extra}


HOSTILE = {
    "dotdot": [_file("../escaped", b"x")],
    "deep dotdot": [_file("fxgraph/../../escaped", b"x")],
    "absolute": [_file("/tmp/escaped-absolute", b"x")],
    "not normalised": [_file("a//b", b"x")],
    "absolute symlink": [{"path": "l", "link": "/etc", "mode": 0o777}],
    "symlink out": [{"path": "sub/l", "link": "../../..", "mode": 0o777}],
    "file beneath symlink": [{"path": "l", "link": "sub", "mode": 0o777}, _file("l/f", b"x")],
    "file beneath file": [_file("f", b"x"), _file("f/g", b"x")],
    "NUL": [_file("a\x00b", b"x")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_manifests_are_refused_with_nothing_written(tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "cache" / "root"
    files = [_file("good/first", b"good")] + HOSTILE[case]  # a good file first: it must not be written either
    sid = _hostile_vault(tmp_path / "vault", files, [b"good", b"x"], root)
    proc = ev(tmp_path / "vault", "cache", "restore", sid, "--archived-roots", check=False)
    assert_one_line_error(proc, "refusing")
    assert proc.returncode == 3
    assert not (tmp_path / "cache").exists() and not any(outside.iterdir())
    assert not Path("/tmp/escaped-absolute").exists() and not (tmp_path / "escaped").exists()


def test_a_root_the_environment_does_not_name_is_not_written(tmp_path):
    victim = tmp_path / "home" / ".ssh"  # a vault may name any folder as a cache's root
    sid = _hostile_vault(tmp_path / "vault", [_file("authorized_keys", b"ssh-ed25519 AAAA attacker")],
                         [b"ssh-ed25519 AAAA attacker"], victim)
    env = _clean_env(tmp_path / "vault", tmp_path)
    out = ev_json(tmp_path / "vault", "cache", "restore", sid, env=env)
    assert out["caches"] == [] and out["skipped"][0]["root"] == str(victim)
    assert not (tmp_path / "home").exists()
    # A cache directory of this environment (here TORCHINDUCTOR_CACHE_DIR) is trusted as it is.
    ic_sid = _hostile_vault(tmp_path / "vault", [_file("fxgraph/ab/k/e", b"x")], [b"x"], tmp_path / "ic")
    done = ev_json(tmp_path / "vault", "cache", "restore", ic_sid, env=env)
    assert done["skipped"] == [] and (tmp_path / "ic" / "fxgraph/ab/k/e").read_bytes() == b"x"


def test_symlink_on_disk_leading_out_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(outside, root / "sub")  # an existing folder of the cache that leads elsewhere
    sid = _hostile_vault(tmp_path / "vault", [_file("a", b"x"), _file("sub/f", b"x")], [b"x"], root)
    proc = ev(tmp_path / "vault", "cache", "restore", sid, "--to", root, check=False)
    assert_one_line_error(proc, "refusing", "outside the cache root")
    assert sorted(p.name for p in root.iterdir()) == ["sub"] and not any(outside.iterdir())


def test_damaged_object_aborts_before_anything_is_renamed(tmp_path):
    root = tmp_path / "root"
    good = _file("a/first", b"good")
    lying = _file("b/second", b"other bytes")  # its chunk is not in the vault as these bytes
    lying["chunks"] = [object_id(b"good")]
    sid = _hostile_vault(tmp_path / "vault", [good, lying], [b"good"], root)
    proc = ev(tmp_path / "vault", "cache", "restore", sid, "--archived-roots", check=False)
    assert_one_line_error(proc, "do not make the archived file")
    assert proc.returncode == 5
    assert not root.exists()  # the folders it made are gone too, and no temp file is left
    assert _leftovers(tmp_path) == []  # nor the folder the new root was being made in


# -- a root that does not exist yet: made beside it, then renamed in ------------------------------------


def _leftovers(folder: Path) -> list[str]:
    """The temp entries of a cache restore in ``folder`` (``.<name>.envvault-<pid>-<run>.tmp``)."""
    return sorted(p.name for p in folder.iterdir() if ".envvault-" in p.name)


def _snapped_small_cache(tmp_path: Path) -> tuple[Path, str]:
    vault = tmp_path / "vault"
    return vault, ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", _small_cache(tmp_path / "c"))["id"]


def test_a_root_that_does_not_exist_is_made_whole_beside_it(tmp_path):
    vault, sid = _snapped_small_cache(tmp_path)
    into_existing = tmp_path / "existing"
    into_existing.mkdir()  # an existing (empty) root: files staged and renamed in one by one
    ev_json(vault, "cache", "restore", sid, "--to", into_existing)
    new = tmp_path / "new" / "deeper" / "root"  # neither it nor its parents exist
    got = ev_json(vault, "cache", "restore", sid, "--to", new)["caches"][0]
    assert tree(new) == tree(into_existing)  # the same files, modes, symlinks and empty folders
    assert len(tree(new)) > 10 and got["written_files"] == sum(1 for k in tree(new).values() if k[0] != "dir")
    assert os.listdir(new.parent) == ["root"]  # its temp folder renamed, nothing left beside it


def _planned(vault_dir: Path, sid: str, dest: Path, mode: str = "merge"):
    from envvault.caches.restore import select_caches
    from envvault.caches.restore_tree import plan_tree
    from envvault.model.cache import parse_manifest

    vault = Vault.open(vault_dir)
    entry = select_caches(vault.load_snapshot(sid).snapshot)[0]
    return vault, plan_tree(parse_manifest(vault.get_json(entry.manifest), "m"), entry.manifest, dest, mode)


def test_a_root_made_after_the_plan_is_planned_again_and_merged_into(tmp_path):
    from envvault.caches.restore_tree import execute_tree
    from envvault.vault.store import ObjectReader

    vault_dir, sid = _snapped_small_cache(tmp_path)
    dest = tmp_path / "dest"
    vault, plan = _planned(vault_dir, sid, dest)
    assert plan.fresh and plan.kept == 0
    (dest / "xy").mkdir(parents=True)  # a compile made the root meanwhile, and one file in it
    (dest / "xy/cxy.py").write_bytes(b"compiled meanwhile")
    execute_tree(plan, ObjectReader(vault))
    assert (dest / "xy/cxy.py").read_bytes() == b"compiled meanwhile"  # merge never overwrites
    assert (dest / "fxgraph/ab/fabc/entry1").read_bytes() == b"graph one" * 100
    assert not plan.fresh and plan.kept == 1 and "xy/cxy.py" not in {f.path for f in plan.writes}
    assert _leftovers(tmp_path) == []


def test_a_vault_read_error_while_a_new_root_is_written_is_that_error(tmp_path, monkeypatch):
    """A vault object that cannot be read (an I/O error: ``ReadFailed``, simulated here, the one thing a disk
    here cannot do on demand) while a new root is written: that error, naming the root, not its temp folder;
    it was a TypeError (its class takes ``why``, not ``exit_code``: helper 35), an internal error, exit 70."""
    from envvault import materialize
    from envvault.caches.restore_tree import execute_tree
    from envvault.vault.backend import ReadFailed
    from envvault.vault.store import ObjectReader

    vault_dir, sid = _snapped_small_cache(tmp_path)
    dest = tmp_path / "dest"
    vault, plan = _planned(vault_dir, sid, dest)
    assert plan.fresh

    def unreadable(reader, root, specs, *args, **kwargs):
        raise ReadFailed(f"cannot read {root}/packs/p.pack: Input/output error", "Input/output error")

    monkeypatch.setattr(materialize, "stage", unreadable)
    with pytest.raises(ReadFailed) as caught:
        execute_tree(plan, ObjectReader(vault))
    assert str(caught.value) == f"cannot read {dest}/packs/p.pack: Input/output error"
    assert caught.value.why == "Input/output error" and caught.value.exit_code == 6
    assert not dest.exists() and _leftovers(tmp_path) == []


def test_an_empty_folder_made_after_the_plan_is_replaced_by_the_new_root(tmp_path):
    from envvault.caches.restore_tree import execute_tree
    from envvault.vault.store import ObjectReader

    vault_dir, sid = _snapped_small_cache(tmp_path)
    reference = tmp_path / "reference"
    reference.mkdir()
    ev_json(vault_dir, "cache", "restore", sid, "--to", reference)
    dest = tmp_path / "dest"
    vault, plan = _planned(vault_dir, sid, dest)
    dest.mkdir()
    execute_tree(plan, ObjectReader(vault))
    assert plan.fresh and tree(dest) == tree(reference) and _leftovers(tmp_path) == []


def test_a_symlink_leading_out_made_after_the_plan_is_refused(tmp_path):
    from envvault.caches.restore_tree import execute_tree
    from envvault.errors import RefusedError
    from envvault.vault.store import ObjectReader

    vault_dir, sid = _snapped_small_cache(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    vault, plan = _planned(vault_dir, sid, dest)
    dest.mkdir()  # made between the plan and the rename, with a folder of the cache that leads out
    os.symlink(outside, dest / "xy")
    with pytest.raises(RefusedError, match="outside the cache root"):
        execute_tree(plan, ObjectReader(vault))
    assert not any(outside.iterdir()) and os.listdir(dest) == ["xy"] and _leftovers(tmp_path) == []


def test_a_replace_whose_root_appears_as_a_symlink_meanwhile_deletes_nothing(tmp_path):
    """A ``--replace`` of a root that did not exist, when a symlink to another folder takes the root's place
    while the files are written: the restore is planned again as a merge, so nothing in that folder is
    removed or replaced, and it says so."""
    from envvault.caches.restore_tree import execute_tree
    from envvault.vault.store import ObjectReader

    vault_dir, sid = _snapped_small_cache(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_bytes(b"four years")
    (home / "xy").mkdir()
    (home / "xy" / "cxy.py").write_bytes(b"mine")
    dest = tmp_path / "dest"
    vault, plan = _planned(vault_dir, sid, dest, "replace")
    os.symlink(home, dest)
    execute_tree(plan, ObjectReader(vault))
    assert (home / "thesis.tex").read_bytes() == b"four years" and (home / "xy" / "cxy.py").read_bytes() == b"mine"
    assert plan.mode == "merge" and plan.removals == [] and _leftovers(tmp_path) == []
    assert any("appeared while the cache was restored" in w for w in plan.warnings)


def test_the_warnings_of_a_restore_planned_again_are_reported(tmp_path, monkeypatch):
    """What the second plan leaves out (a file where the archive has a folder) is in the result's warnings."""
    from envvault.caches import restore_tree
    from envvault.caches.restore import restore_snapshot_caches

    vault_dir, sid = _snapped_small_cache(tmp_path)
    dest = tmp_path / "dest"
    real_stage = restore_tree.materialize.stage

    def stage_then_a_compile_makes_the_root(*args, **kwargs):
        out = real_stage(*args, **kwargs)
        if not dest.exists():  # the first staging only (into the temp folder)
            dest.mkdir()
            (dest / "xy").write_bytes(b"a file where the archive has a folder")
        return out

    monkeypatch.setattr(restore_tree.materialize, "stage", stage_then_a_compile_makes_the_root)
    vault = Vault.open(vault_dir)
    result = restore_snapshot_caches(vault, vault.load_snapshot(sid).snapshot, to=dest)
    (entry,) = result.entries
    assert entry.mode == "merge" and (dest / "xy").read_bytes() == b"a file where the archive has a folder"
    assert (dest / "fxgraph/ab/fabc/entry1").read_bytes() == b"graph one" * 100
    said = " | ".join(result.warnings)
    assert "appeared while the cache was restored" in said and "left out what lies under xy" in said, said
    assert _leftovers(tmp_path) == []


def test_folder_modes_of_a_new_root_are_those_of_an_existing_one(tmp_path):
    """A manifest's folder entries get their modes the same way whether the root is new (made beside it) or
    there already: an empty folder made by the restore gets its mode, a folder that holds files keeps the
    mode it was made with; and no temp folder is left even with a folder the owner cannot enter."""
    files = [_file("a/f", b"x"), {"path": "a", "dir": True, "mode": 0o500},
             {"path": "e", "dir": True, "mode": 0o500}, {"path": "locked", "dir": True, "mode": 0o000}]
    modes = {}
    for name in ("existing", "new"):
        root = tmp_path / name
        if name == "existing":
            root.mkdir()
        sid = _hostile_vault(tmp_path / f"vault-{name}", files, [b"x"], root)
        ev_json(tmp_path / f"vault-{name}", "cache", "restore", sid, "--to", root)
        modes[name] = {p: stat.S_IMODE((root / p).stat().st_mode) for p in ("a", "e", "locked", "a/f")}
    assert modes["new"] == modes["existing"]
    assert modes["new"]["e"] == 0o500 and modes["new"]["locked"] == 0o000 and modes["new"]["a"] != 0o500
    assert _leftovers(tmp_path) == []


def test_a_new_root_whose_temp_name_is_too_long_is_restored_file_by_file(tmp_path):
    root = tmp_path / ("c" * 240)  # the temp name beside it would pass the file system's 255 bytes
    sid = _hostile_vault(tmp_path / "vault", [_file("fxgraph/e", b"x")], [b"x"], root)
    done = ev_json(tmp_path / "vault", "cache", "restore", sid, "--to", root)["caches"][0]
    assert done["written_files"] == 1 and (root / "fxgraph/e").read_bytes() == b"x"
    assert _leftovers(tmp_path) == []


def test_the_walker_leaves_out_a_killed_restores_temp_folder_whatever_the_root_is_called():
    from envvault.caches.walk import is_transient, restore_temp_name

    for name in ("inductor", "a\nb", "with space", ".dot"):
        temp = os.path.basename(restore_temp_name(f"/x/{name}", 4242))
        assert is_transient(f"sub/{temp}", is_dir=True), temp
    assert not is_transient("sub/.a.envvault-1-zz.tmp", is_dir=True)  # not a run id
    assert not is_transient("sub/inductor", is_dir=True)


def test_a_killed_restores_temp_folder_is_removed_by_the_next_restore_only_when_surely_dead(tmp_path):
    """Beside the root, only this root's temp folders (the exact temp name), of this user, whose process is
    gone and that nobody touched for an hour are removed; a symlink of that name is never followed."""
    vault, sid = _snapped_small_cache(tmp_path)
    parent = tmp_path / "p"
    parent.mkdir()
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it
    old = time.time() - 7200

    def leftover(name: str, age: float = old) -> Path:
        d = parent / name
        d.mkdir()
        (d / "half-written").write_bytes(b"x" * 100)
        os.utime(d, (age, age))
        return d

    stale = leftover(f".root.envvault-{dead}-abcdef.tmp")
    impossible = leftover(f".root.envvault-{10 ** 20}-abcde4.tmp")  # no process can have it either
    kept = [leftover(f".root.envvault-{dead}-abcde0.tmp", time.time() - 60),  # touched a minute ago
            leftover(f".root.envvault-{os.getpid()}-abcde1.tmp"),  # its process runs
            leftover(f".other.envvault-{dead}-abcde2.tmp"),  # another root's
            leftover(f".root.envvault-{dead}-zzzzzz.tmp")]  # not a temp name of ours
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep")
    link = parent / f".root.envvault-{dead}-abcde3.tmp"
    os.symlink(outside, link)
    os.utime(link, (old, old), follow_symlinks=False)
    ev_json(vault, "cache", "restore", sid, "--to", parent / "root")
    assert not stale.exists() and not impossible.exists() and all(k.is_dir() for k in kept)
    assert link.is_symlink() and (outside / "precious").read_bytes() == b"keep"
    assert (parent / "root" / "fxgraph/ab/fabc/entry1").read_bytes() == b"graph one" * 100


@pytest.mark.parametrize("how, left", [("KILL", 1), ("TERM", 0)])
def test_a_restore_killed_while_it_makes_a_new_root_leaves_no_root(tmp_path, how, left):
    """SIGKILL at the third staged file leaves the temp folder beside the root (never archived by a cache
    snap, and no obstacle to the next restore); SIGTERM removes it. Either way the root does not exist."""
    vault, sid = _snapped_small_cache(tmp_path)
    dest = tmp_path / "p" / "root"
    dest.parent.mkdir()
    at = "stage:3" + (":TERM" if how == "TERM" else "")
    proc = ev(vault, "cache", "restore", sid, "--to", dest, check=False, env=ev_env(vault, ENVVAULT_TEST_CRASH_AT=at))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert not os.path.lexists(dest) and len(_leftovers(dest.parent)) == left
    snapped = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", dest.parent)["caches"][0]
    assert snapped["files"] == 0  # a killed restore's temp folder is not a cache's content
    ev_json(vault, "cache", "restore", sid, "--to", dest)
    reference = tmp_path / "reference"
    reference.mkdir()
    ev_json(vault, "cache", "restore", sid, "--to", reference)
    assert tree(dest) == tree(reference) and len(_leftovers(dest.parent)) == left


def _temps_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if ".envvault-" in p.name)


def test_temp_files_a_killed_restore_left_in_an_existing_root_are_removed_once_surely_dead(tmp_path):
    """A restore into an existing root stages each file beside its final name; SIGKILL leaves those temp
    files (never archived). The next restore that writes into their folders removes them once they are an
    hour old and their process is gone (a temp symlink is removed, never followed); younger ones, and those
    of a running process, stay."""
    vault, sid = _snapped_small_cache(tmp_path)
    dest = tmp_path / "root"
    dest.mkdir()
    proc = ev(vault, "cache", "restore", sid, "--to", dest, check=False,
              env=ev_env(vault, ENVVAULT_TEST_CRASH_AT="stage:3"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    killed = _temps_under(dest)
    assert len(killed) >= 3, killed  # the killed restore's staged files
    assert ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", dest)["caches"][0]["files"] == 0
    folder = killed[0].parent
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep")
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    link = folder / f".x.envvault-{dead}-abcde3.tmp"
    os.symlink(outside / "precious", link)
    alive = folder / f".y.envvault-{os.getpid()}-abcde1.tmp"
    alive.write_bytes(b"a restore still running")
    ev_json(vault, "cache", "restore", sid, "--to", dest)  # nothing was placed: every file written again
    assert set(_temps_under(dest)) == {*killed, link, alive}  # all younger than an hour
    old = time.time() - 7200
    for p in _temps_under(dest):
        os.utime(p, (old, old), follow_symlinks=False)
    for p in dest.rglob("*"):
        if p.is_file() and not p.is_symlink() and ".envvault-" not in p.name:
            p.unlink()  # so that the next restore writes into every folder again
    ev_json(vault, "cache", "restore", sid, "--to", dest)
    assert _temps_under(dest) == [alive] and (outside / "precious").read_bytes() == b"keep"
    reference = tmp_path / "reference"
    ev_json(vault, "cache", "restore", sid, "--to", reference)
    alive.unlink()
    assert tree(dest) == tree(reference)


def test_a_full_disk_under_a_new_root_is_named_as_the_root_not_its_temp_folder(tmp_path):
    vault = tmp_path / "vault"
    big = _small_cache(tmp_path / "c")
    (big / "fxgraph" / "big.bin").write_bytes(os.urandom(600_000))
    sid = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", big)["id"]
    disk = tmp_path / "disk"
    disk.mkdir()
    with mounted(disk, tmpfs_size="256k"):
        proc = ev(vault, "cache", "restore", sid, "--to", disk / "root", check=False)
        assert_one_line_error(proc, "no space left", f"writing {disk / 'root'}/")
        assert ".envvault-" not in proc.stderr and "committed" not in proc.stderr  # not the vault's words
        assert proc.returncode == 6 and os.listdir(disk) == []


def test_a_read_only_cache_root_is_not_blamed_on_the_vault(tmp_path):
    vault, sid = _snapped_small_cache(tmp_path)
    dest = tmp_path / "root"
    dest.mkdir()
    with mounted(dest):
        proc = ev(vault, "cache", "restore", sid, "--to", dest, check=False)
        assert_one_line_error(proc, "read-only filesystem", str(dest))
        assert "--vault" not in proc.stderr and "the vault at" not in proc.stderr
        assert proc.returncode == 6
    assert os.listdir(dest) == []


def test_environment_restore_of_a_cache_only_snapshot_is_refused(tmp_path, make_venv):
    venv = make_venv("uv")
    root = _small_cache(tmp_path / "c")
    vault = tmp_path / "vault"
    sid = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)["id"]
    before = sorted(p.name for p in (venv / "lib").rglob("*"))
    proc = ev(vault, "restore", sid, "--venv", venv, "--no-backup", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert sorted(p.name for p in (venv / "lib").rglob("*")) == before


def test_latest_is_the_newest_environment_snapshot_and_a_cache_only_one_is_refused_by_name(tmp_path, make_venv):
    """A `cache snap` after a snap (the usual order: train, then archive the compile cache) does not become
    what `restore latest`, `diff latest current` or `export latest` act on; named, a cache-only snapshot gets
    one line that points to the cache commands (exit 3, as before) from every command that needs an environment."""
    from fixtures import build_wheel, uv_install

    venv = make_venv("uv")
    uv_install(venv, build_wheel(tmp_path / "w", "tiny", "1.0", {"tiny/__init__.py": b"X = 1\n"}))
    vault = tmp_path / "vault"
    env_sid = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    cache_sid = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", _small_cache(tmp_path / "c"))["id"]
    assert ev_json(vault, "list")["snapshots"][0]["id"] == cache_sid  # the newest of all
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    subprocess.run([uv, "pip", "uninstall", "--python", str(venv / "bin" / "python"), "tiny"], check=True,
                   capture_output=True)
    assert ev_json(vault, "restore", "latest", "--venv", venv, "--dry-run")["restored"] == env_sid
    changed = ev_json(vault, "diff", "latest", "current", "--venv", venv)
    assert changed["old"] == env_sid[:12] and [p["name"] for p in changed["packages"]["removed"]] == ["tiny"]
    assert ev_json(vault, "export", "latest", "-o", tmp_path / "pylock.toml", "--no-wheels")["packages"] >= 1
    assert ev_json(vault, "show", "latest")["id"] == env_sid
    assert ev_json(vault, "cache", "diff", "latest", cache_sid)["a_id"] == cache_sid  # the cache commands' own
    for args in (["restore", cache_sid, "--venv", venv], ["restore", cache_sid[:8], "--into", tmp_path / "new"],
                 ["diff", cache_sid, "latest"], ["export", cache_sid, "-o", tmp_path / "x.toml"],
                 ["status", "--against", cache_sid, "--venv", venv]):
        proc = ev(vault, *args, check=False)
        assert_one_line_error(proc, "cache-only", f"envvault cache restore {cache_sid[:12]}")
        assert proc.returncode == 3, args
    assert not (tmp_path / "new").exists() and not (tmp_path / "x.toml").exists()


# -- a cache that changes while it is archived ------------------------------------------------------

WRITER = r"""
import hashlib, os, sys, time, uuid
root, seconds = sys.argv[1], float(sys.argv[2])
def blob(n, seed):
    body = hashlib.sha256(seed.encode()).digest() * (n // 32)
    return hashlib.sha256(body).digest() + body  # self-checking: first 32 bytes hash the rest
end = time.time() + seconds
i = 0
big = os.path.join(root, "inplace", "big.bin")
os.makedirs(os.path.dirname(big), exist_ok=True)
with open(big, "wb") as f:
    f.write(blob(4 << 20, "start"))
print("ready", flush=True)
while time.time() < end:
    i += 1
    # Inductor's way: a temp file, then rename. New entries appear all the time.
    d = os.path.join(root, "fxgraph", f"{i % 7:02d}", f"entry{i}")
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".data.{os.getpid()}.{i}.tmp")
    with open(tmp, "wb") as f:
        f.write(blob(200_000 + i % 5 * 65536, f"e{i}"))
    os.replace(tmp, os.path.join(d, "data"))
    # A writer that rewrites a big file in place, in pieces: never readable whole.
    with open(big, "r+b") as f:
        data = blob(4 << 20, f"big{i}")
        for off in range(0, len(data), 1 << 18):
            f.write(data[off:off + (1 << 18)])
            f.flush()
            time.sleep(0.001)
"""


def _self_consistent(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) > 32 and hashlib.sha256(data[32:]).digest() == data[:32]


def test_cache_changing_while_read_gives_complete_files_or_a_warning(tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    vault = tmp_path / "vault"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), "60"], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        snaps = []
        for _ in range(4):
            snaps.append(ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root))
            time.sleep(0.2)
    finally:
        writer.kill()
        writer.wait()
    warned = 0
    for i, out in enumerate(snaps):
        (entry,) = out["caches"]
        dest = tmp_path / f"restored{i}"
        ev(vault, "cache", "restore", out["id"], "--to", dest)
        restored = [p for p in dest.rglob("*") if p.is_file()]
        assert len(restored) == entry["files"] > 0
        bad = [p for p in restored if not _self_consistent(p)]
        assert bad == [], f"corrupt files archived: {bad}"
        big_kept = (dest / "inplace" / "big.bin").exists()
        big_warned = any("inplace/big.bin" in w and "being written each time" in w for w in entry["warnings"])
        assert big_kept != big_warned  # either complete or named in a warning
        warned += big_warned
    assert warned >= 1  # the in-place writer really did overlap the reads
    assert ev_json(vault, "verify")["ok"] is True


# -- integration with envvault snap, config, diff, dedup --------------------------------------------


def test_envvault_snap_takes_caches_by_default_and_restore_brings_them_back(tmp_path, make_venv):
    from fixtures import build_wheel, uv_install

    venv = make_venv("uv")  # with a torch package: an environment's snap takes Inductor's cache only then
    uv_install(venv, build_wheel(tmp_path / "stub", "torch", "2.13.0", {
        "torch/__init__.py": b"", "torch/version.py": b"__version__ = '2.13.0'\ncuda = None\n"}))
    vault = tmp_path / "vault"
    env = _clean_env(vault, tmp_path)
    ic = _small_cache(tmp_path / "ic")
    reference = tree(ic)
    out = ev_json(vault, "snap", "--venv", venv, env=env)
    doc = ev_json(vault, "show", out["id"], env=env)
    kinds = {c["kind"]: c for c in doc["caches"]}
    assert kinds["inductor"]["root"] == str(ic) and kinds["inductor"]["files"] == 8
    assert kinds["inductor"]["fingerprint"]["python"] == doc["python"]["version"]  # completed from the venv
    assert ev_json(vault, "snap", "--venv", venv, "--no-caches", env=env)["id"]
    no_caches = ev_json(vault, "show", "latest", env=env)
    assert no_caches["caches"] == []
    shutil.rmtree(ic)
    ev(vault, "restore", out["id"], "--venv", venv, "--no-backup", env=env)
    assert {k: v for k, v in tree(ic).items() if not k.startswith("locks/")} == {
        k: v for k, v in reference.items() if not (k.startswith("locks/") or k.endswith(".tmp") or "tmp.pid" in k)
    }


def test_a_named_cache_dir_is_taken_in_a_venv_without_torch(tmp_path, make_venv):
    """A venv without torch does not take the discovered Inductor cache (it cannot use it), but the same
    folder named with --cache-dir is taken: what the user names is always archived."""
    venv = make_venv("uv")
    vault = tmp_path / "vault"
    env = _clean_env(vault, tmp_path)
    ic = _small_cache(tmp_path / "ic")  # TORCHINDUCTOR_CACHE_DIR of env
    plain = ev_json(vault, "show", ev_json(vault, "snap", "--venv", venv, env=env)["id"], env=env)
    assert plain["caches"] == []
    named = ev_json(vault, "snap", "--venv", venv, "--cache-dir", ic, env=env)
    caches = ev_json(vault, "show", named["id"], env=env)["caches"]
    assert [(c["root"], c["files"]) for c in caches] == [(str(ic), 8)]


def test_a_cache_an_environment_restore_leaves_is_named_once(tmp_path, make_venv):
    """A cache an environment's restore does not put back (its root is no cache folder of the new venv) is
    one warning line naming the way (--to), not that line and a second "cache skipped" line (helper 31)."""
    venv = make_venv("uv")
    vault = tmp_path / "vault"
    env = _clean_env(vault, tmp_path)
    mine = _small_cache(tmp_path / "mine")
    sid = ev_json(vault, "snap", "--venv", venv, "--cache-dir", mine, env=env)["id"]
    shutil.rmtree(mine)
    proc = ev(vault, "restore", sid, "--into", tmp_path / "copy", env=env)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == len(set(lines)), proc.stderr
    about = [line for line in lines if "cache" in line]
    assert len(about) == 1 and f"pass --to {mine}" in about[0], proc.stderr
    assert not mine.exists()


def test_remembered_and_per_venv_cache_dirs(tmp_path, make_venv):
    venv = make_venv("uv")
    vault = tmp_path / "vault"
    env = _clean_env(vault, tmp_path)
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    (mine / "k").mkdir(parents=True)
    (mine / "k" / "kernel.bin").write_bytes(b"mine")
    (theirs / "x").mkdir(parents=True)
    (theirs / "x" / "kernel.bin").write_bytes(b"theirs")
    named = ev_json(vault, "cache", "snap", "--cache-dir", mine, "--remember", "vault", env=env)
    assert [(c["root"], c["reason"]) for c in named["caches"]] == [(str(mine), "named with --cache-dir")]
    # The same folder, unchanged, configured now: its entry is reused, with this snap's reason (helper 35).
    again = ev_json(vault, "cache", "snap", env=env)["caches"]
    assert [(c["root"], c["reason"], c["reused"]) for c in again] == [(str(mine), "configured", True)]
    named = ev_json(vault, "cache", "snap", "--cache-dir", mine, env=env)
    assert [(c["root"], c["reason"], c["reused"]) for c in named["caches"]] == [(str(mine), "named with --cache-dir", True)]
    (venv / ".envvault.toml").write_text('[guard]\nprotect = ["torch"]\n\n[caches]\ndirs = ["../theirs"]\n')
    out = ev_json(vault, "cache", "snap", "--venv", venv, env=env)
    assert {(c["root"], c["reason"]) for c in out["caches"]} == {(str(mine), "configured"), (str(theirs), "configured")}
    where = ev_json(vault, "cache", "list", "--where", "--venv", venv, env=env)["locations"]
    assert {row["path"] for row in where if row["archived_by_snap"]} == {str(mine), str(theirs)}
    assert json.loads((vault / "settings.json").read_text())["caches"]["dirs"] == [str(mine)]


def test_cache_diff_side_by_side(tmp_path, torch_venv):
    root = _small_cache(tmp_path / "c")
    vault = tmp_path / "vault"
    a = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)["id"]
    (root / "fxgraph/ab/fabc/entry1").write_bytes(b"changed")
    shutil.rmtree(root / "aotautograd")
    (root / "zz").mkdir()
    (root / "zz" / "czz.py").write_bytes(b"new")
    b = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)["id"]
    h200 = _extract_h200(tmp_path / "h")
    c = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", h200)["id"]
    d = ev_json(vault, "cache", "diff", a, b)
    (pair,) = d["caches"]
    assert pair["changed"] == ["fxgraph/ab/fabc"] and pair["only_a"] == ["aotautograd/aaa"]
    assert pair["only_b"] == ["zz/czz.py"] and d["same"] is False
    far = ev_json(vault, "cache", "diff", b, c)
    rows = {r["label"]: r for r in far["caches"][0]["fingerprint"]}
    assert rows["torch"]["b"] == "2.11.0+cu130" and rows["torch"]["differs"] is True
    assert rows["gpus"]["b"] == "NVIDIA H200 (9.0)"
    text = ev(vault, "cache", "diff", b, c).stdout
    assert "2.11.0+cu130" in text and "only in B" in text
    assert ev_json(vault, "cache", "diff", a, a)["same"] is True
    # A symlink is compared, but the entry counts are the ones `cache snap` and `cache list` give.
    os.symlink("zz/czz.py", root / "alias.py")
    linked = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
    (listed,) = [c for c in ev_json(vault, "cache", "list", linked["id"])["caches"]]
    pair = ev_json(vault, "cache", "diff", b, linked["id"])["caches"][0]
    assert pair["only_b"] == ["alias.py"] and pair["entries_b"] == listed["entries"] == pair["entries_a"], pair


def test_near_identical_large_files_share_chunks(tmp_path):
    root = tmp_path / "pch"
    root.mkdir()
    base = os.urandom(12 << 20)
    (root / "one.h.gch").write_bytes(base)
    vault = tmp_path / "vault"
    first = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
    twin = bytearray(base)
    twin[5_000_000:5_000_008] = b"12345678"  # a few bytes differ
    (root / "two.h.gch").write_bytes(bytes(twin))
    second = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
    assert first["new_bytes"] > 12 << 20  # random bytes do not compress
    assert second["new_bytes"] < 0.4 * (12 << 20)
    shutil.rmtree(root)
    ev(vault, "cache", "restore", second["id"], "--archived-roots")
    assert (root / "two.h.gch").read_bytes() == bytes(twin) and (root / "one.h.gch").read_bytes() == base


def test_kind_and_root_together_choose_the_cache_of_both():
    """``cache restore --kind inductor --root R --to DIR`` with two Inductor caches (the cache folder and
    ``precompiled_headers``, as a real CPU compile makes): the two filters were either-or, so both caches were
    chosen and ``--to`` refused (helper 31). Each narrows; together a cache must match both."""
    from envvault.caches.restore import select_caches
    from envvault.model.records import replace
    from envvault.model.snapshot import CacheEntry, Snapshot

    caches = (CacheEntry(kind="inductor", root="/c/inductor", manifest="a" * 64),
              CacheEntry(kind="inductor", root="/tmp/torchinductor_u/precompiled_headers", manifest="b" * 64),
              CacheEntry(kind="triton", root="/c/triton", manifest="c" * 64))
    snap = replace(Snapshot(), caches=caches)
    pick = lambda *s: [c.root for c in select_caches(snap, s)]  # noqa: E731
    assert pick("inductor", "/c/inductor") == ["/c/inductor"]
    assert pick("inductor") == ["/c/inductor", "/tmp/torchinductor_u/precompiled_headers"]
    assert pick("/c/triton") == ["/c/triton"]
    assert pick("inductor", "triton", "/c/triton") == ["/c/triton"]
    assert pick("triton", "/c/inductor") == []


def test_the_hint_for_precompiled_headers_restored_elsewhere_names_where_torch_keeps_them(tmp_path):
    """Inductor keeps precompiled headers under its default root whatever ``TORCHINDUCTOR_CACHE_DIR`` says: a
    restore of them elsewhere told the user to set that variable (helper 31). It names where they belong."""
    from envvault.caches.restore import _where_torch_looks

    env = {"TMPDIR": str(tmp_path), "USER": "u", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ic")}
    (hint,) = _where_torch_looks("inductor", tmp_path / "elsewhere" / "precompiled_headers", env)
    assert f"--to {tmp_path / 'torchinductor_u' / 'precompiled_headers'}" in hint and "whatever" in hint, hint
    (other,) = _where_torch_looks("inductor", tmp_path / "elsewhere", env)
    assert "TORCHINDUCTOR_CACHE_DIR=" in other

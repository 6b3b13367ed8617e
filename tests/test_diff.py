"""diff and status: what changed, as data and as one screen of text; `current` and pylock sides."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from envvault.commands.diff_text import render_text
from envvault.diff import diff_snapshots
from fixtures import catalogue as C
from fixtures import uv_install
from tests.evtools import ev, ev_env, ev_json


def _pkg(name, version, build="b", state=None, info=None, modified=(), missing=()):
    build_id = (build * 64)[:64]
    return {"name": name, "version": version, "build_id": build_id, "state_id": state or build_id,
            "manifest": "0" * 64, "build_info": info, "modified": list(modified), "missing": list(missing),
            "files": 1, "size": 1}


def _doc(packages, python="3.11.7", host=None, env=None):
    return {"packages": packages,
            "python": {"implementation": "cpython", "version": python, "abi": "cp" + "".join(python.split(".")[:2]),
                       "platform": "linux-x86_64"},
            "host": host or {"os": "Linux-6.1", "arch": "x86_64", "gpus": [{"name": "NVIDIA H200", "compute_cap": "9.0"}],
                             "driver": "580.1"},
            "env": env if env is not None else {"CUDA_VISIBLE_DEVICES": "0"}}


CU128 = {"cuda": "12.8", "git_version": "1a2b3c4d5e", "version": "2.11.0+cu128"}
CU130 = {"cuda": "13.0", "git_version": "4d5e6f7a8b", "version": "2.11.0+cu130"}


def test_every_kind_of_change():
    old = _doc([
        _pkg("torch", "2.11.0", "a", info=CU128),
        _pkg("numpy", "2.1.0", "n"),
        _pkg("gone", "1.0", "g"),
        _pkg("older", "3.0", "o"),
        _pkg("vllm", "0.9.0+cu128", "v", info=CU128),
        _pkg("patched", "1.0", "p"),
    ])
    new = _doc([
        _pkg("torch", "2.11.0", "c", info=CU130),
        _pkg("numpy", "2.2.0", "m"),
        _pkg("older", "2.0", "q"),
        _pkg("vllm", "0.9.0+cu130", "w", info=CU130),
        _pkg("patched", "1.0", "p", state="e" * 64, modified=["lib/x/patched.py"]),
        _pkg("sglang", "0.5", "s"),
    ], python="3.12.1", host={"os": "Linux-6.1", "arch": "x86_64", "gpus": [], "driver": None},
        env={"CUDA_VISIBLE_DEVICES": "1", "TORCH_LOGS": "+dynamo"})
    r = diff_snapshots(old, new)
    j = r.to_json()
    assert [p["name"] for p in j["packages"]["added"]] == ["sglang"]
    assert j["packages"]["removed"] == [{"name": "gone", "version": "1.0", "build_id": "g" * 64}]
    kinds = {c["name"]: c for c in j["packages"]["changed"]}
    assert kinds["torch"]["kind"] == "build" and kinds["torch"]["build_changed"] is True
    assert kinds["torch"]["build_facts"]["cuda"] == ["12.8", "13.0"]
    assert kinds["numpy"]["kind"] == "upgrade" and kinds["older"]["kind"] == "downgrade"
    assert kinds["vllm"]["kind"] == "local"
    assert kinds["patched"]["kind"] == "edited" and kinds["patched"]["modified_files"] == ["lib/x/patched.py"]
    assert kinds["patched"]["build_changed"] is False
    for c in j["packages"]["changed"]:
        assert {"name", "old_version", "new_version", "build_changed", "modified_files"} <= c.keys()
    assert j["python"]["version"] == {"old": "3.11.7", "new": "3.12.1"}
    assert j["host"]["driver"] == {"old": "580.1", "new": None} and "gpus" in j["host"]
    assert j["env"]["changed"] == {"CUDA_VISIBLE_DEVICES": {"old": "0", "new": "1"}}
    assert j["env"]["added"] == {"TORCH_LOGS": "+dynamo"}
    assert not r.empty and not r.environment_empty

    text = render_text(r, colour=False).splitlines()
    heads = [line.split()[0] for line in text]
    order = ["python", "added", "removed", "upgrade", "build", "edited", "host", "env"]
    firsts = [heads.index(h) for h in order]
    assert firsts == sorted(firsts), text  # interpreter, added/removed, versions, builds, edits, host, env
    assert any("torch 2.11.0: cuda 12.8 -> 13.0, git 1a2b3c4 -> 4d5e6f7" in line for line in text), text
    assert any("vllm 0.9.0+cu128 -> 0.9.0+cu130 (local label)" in line for line in text), text
    assert any("lib/x/patched.py" in line for line in text)
    assert "\x1b[" in render_text(r, colour=True) and "\x1b[" not in "\n".join(text)


def test_identical_and_environment_scope():
    a = _doc([_pkg("x", "1.0")])
    b = _doc([_pkg("x", "1.0")], env={"OTHER": "1"})
    assert diff_snapshots(a, a).empty
    r = diff_snapshots(a, b)
    assert not r.empty and r.environment_empty
    assert diff_snapshots(a, b, scope="environment").empty


def test_cli_diff_current_writes_nothing_and_exit_codes(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01], wheelhouse[C.TORCH_CU128])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]

    def listing():
        return sorted(str(p.relative_to(vault)) for p in vault.rglob("*")
                      if p.is_file() and p.relative_to(vault).parts[0] not in ("state", "tmp", "locks"))

    before = listing()
    same = ev(vault, "diff", sid, "current", "--venv", venv, "--exit-code")
    assert same.returncode == 0 and "no differences" in same.stdout
    uv_install(venv, wheelhouse[C.SMALL_02])
    j = ev_json(vault, "diff", sid[:8], "current", "--venv", venv)
    assert j["packages"]["changed"][0]["name"] == "smallpkg" and j["packages"]["changed"][0]["kind"] == "upgrade"
    assert listing() == before  # `current` is read without writing to the vault
    assert ev(vault, "diff", sid, "current", "--venv", venv, "--exit-code", check=False).returncode == 1
    assert ev(vault, "status", "--venv", venv, "--exit-code", check=False).returncode == 1
    proc = ev(vault, "diff", "nosuchtag", "current", "--venv", venv, check=False)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr


def test_diff_against_a_pylock(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_PLAIN_A], wheelhouse[C.SMALL_01])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    lock = tmp_path / "pylock.toml"
    ev(vault, "export", sid, "-o", lock, "--no-wheels")
    assert ev_json(vault, "diff", sid, lock)["packages"] == {"added": [], "removed": [], "changed": []}
    uv_install(venv, "--reinstall-package", "torchlike", wheelhouse[C.TORCH_PLAIN_B])
    j = ev_json(vault, "diff", lock, "current", "--venv", venv)
    (ch,) = j["packages"]["changed"]
    assert ch["name"] == "torchlike" and ch["kind"] == "build" and ch["build_facts"]["cuda"] == ["12.8", "13.0"]


def _synthetic_vault(vault_path: Path, n: int = 200) -> tuple[str, str]:
    from envvault.vault.store import Vault

    v = Vault.open(vault_path, create=True)
    base = {"format": 1, "kind": "snapshot", "message": "", "trigger": "manual", "argv": [], "venv": "/x",
            "lock_only": False, "caches": [], "fingerprint": "", "warnings": [], "stats": {}, **_doc([])}
    old = [_pkg(f"pkg{i:03d}", "1.0", f"{i % 10}") for i in range(n)]
    new = [dict(p) for p in old]
    for i in range(0, n, 10):
        new[i] = _pkg(new[i]["name"], "2.0", "f")
    new[5] = _pkg(new[5]["name"], "1.0", "5", state="e" * 64, modified=["lib/pkg005/a.py"])
    a = v.commit_snapshot(dict(base, packages=old, created="2026-01-01T00:00:00Z"))
    b = v.commit_snapshot(dict(base, packages=new, created="2026-01-02T00:00:00Z"))
    return a, b


def test_diff_of_two_200_package_snapshots(tmp_path):
    """Two 200-package snapshots diff correctly through the library and the CLI. The 150 ms figure is
    measured in bench/bench_restore.py, not here: timings are figures, not test assertions."""
    from envvault.commands.restore import resolve_side
    from envvault.vault.store import Vault

    vault = tmp_path / "vault"
    a, b = _synthetic_vault(vault)
    work = []
    for _ in range(5):
        t0 = time.perf_counter()
        v = Vault.open(vault)
        (la, da), (lb, db) = resolve_side(v, a[:10]), resolve_side(v, b[:10])
        text = render_text(diff_snapshots(da, db, vault=v, old_label=la, new_label=lb), colour=False)
        work.append(time.perf_counter() - t0)
        assert "pkg005" in text and text.count("upgrade") == 20
    cmd = [sys.executable, "-m", "envvault", "diff", a[:10], b[:10]]
    wall = []
    for _ in range(5):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, env=ev_env(vault))
        wall.append(time.perf_counter() - t0)
        assert out.returncode == 0 and "pkg005" in out.stdout
    print(f"diff of two 200-package snapshots: work {min(work) * 1000:.1f} ms, CLI wall best "
          f"{min(wall) * 1000:.0f} ms, median {statistics.median(wall) * 1000:.0f} ms")


def test_a_file_put_back_is_not_reported_as_deleted(tmp_path, make_venv, wheelhouse):
    """A file deleted when the snapshot was taken, then put back: ``status`` said "1 deleted or put back" with
    a "-" before it, and ``missing_files`` named the file that is there (helper 29, defect 5). It is now
    ``put_back_files`` ("+", "put back"); a file deleted since is ``missing_files`` ("-", "deleted")."""
    from fixtures import catalogue as C
    from fixtures import site_packages, uv_install
    from tests.evtools import ev, ev_json

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    vault = tmp_path / "vault"
    files = sorted(p for p in (site_packages(venv) / "smallpkg").rglob("*.py"))
    gone, later = files[0], files[1]
    kept = gone.read_bytes()
    gone.unlink()
    ev_json(vault, "snap", "--no-caches", "--venv", venv)
    gone.write_bytes(kept)
    later.unlink()
    (change,) = ev_json(vault, "status", "--venv", venv)["packages"]["changed"]
    rel = lambda p: p.relative_to(venv).as_posix()  # noqa: E731
    assert change["put_back_files"] == [rel(gone)] and change["missing_files"] == [rel(later)], change
    text = ev(vault, "status", "--venv", venv, check=False).stdout
    assert "1 deleted, 1 put back" in text and f"+ {rel(gone)}" in text and f"- {rel(later)}" in text, text


def test_a_file_name_with_control_characters_is_one_escaped_line():
    """A file name may hold a newline or an escape sequence (a RECORD row is CSV; a snapshot may be anyone's):
    ``status`` and ``diff`` printed it raw, one name split over two lines, an escape obeyed by the terminal
    (helper 29). Text names it escaped, on one line; ``--json`` keeps it exact."""
    a = _doc([_pkg("x", "1.0", missing=["lib/x/a\nb.py"])])
    b = _doc([_pkg("x", "1.0", missing=["lib/x/\x1b[2Jc.py"])])
    r = diff_snapshots(a, b)
    text = render_text(r, colour=False)
    assert "    - lib/x/\\x1b[2Jc.py" in text.splitlines() and "    + lib/x/a\\nb.py" in text.splitlines(), text
    assert "\x1b" not in text
    change = r.to_json()["packages"]["changed"][0]
    assert change["missing_files"] == ["lib/x/\x1b[2Jc.py"] and change["put_back_files"] == ["lib/x/a\nb.py"]


def test_across_versions_no_file_is_put_back():
    """An upgrade whose old side had a file recorded missing: the new version may not ship that file at all,
    so it is not "put back" (helper 32, 9); the files the new side lacks of its own are named deleted."""
    a = _doc([_pkg("x", "1.0", missing=["lib/x/old.py"])])
    b = _doc([_pkg("x", "2.0", build="c", missing=["lib/x/new.py"])])
    (change,) = diff_snapshots(a, b).to_json()["packages"]["changed"]
    assert change["put_back_files"] == [] and change["missing_files"] == ["lib/x/new.py"], change

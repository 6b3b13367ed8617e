"""The unchanged-environment fast path (issue 11): what a second snap imports and runs, the host facts memo."""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

from fixtures import catalogue as C
from fixtures import uv_install
from tests.evtools import ev_env, ev_json


def test_journal_name_spelt_out_agrees(monkeypatch):
    from envvault import journal
    from envvault.env import probe
    from envvault.snap import fresh

    assert fresh.JOURNAL_NAME == journal.JOURNAL_NAME

    class _State:  # what journal_file uses of a vault
        class state:
            path = staticmethod(lambda name: Path("/state") / name)

    root = Path("/opt/some-python-root")
    monkeypatch.setitem(probe._SYSTEMS, str(root), (root / "bin" / "python3", None))  # a system environment
    from envvault.safepaths import env_key

    assert journal.journal_file(_State, root) == Path("/state") / fresh.STATE_JOURNAL.format(key=env_key(root))


def test_nvidia_smi_answer_is_remembered_while_the_driver_stays(monkeypatch):
    from envvault.env import host

    calls = []
    key = ["boot-1", "NVRM version 580", ["0000:00:06.0"]]
    answer = {"gpus": [{"name": "NVIDIA H200", "compute_cap": "9.0", "memory": "143771 MiB"}], "driver": "580"}
    monkeypatch.setattr(host, "_gpu_key", lambda: list(key))
    monkeypatch.setattr(host, "_nvidia", lambda: calls.append(1) or dict(answer))
    memo: dict = {}
    first = host.host_facts(memo)
    second = host.host_facts(memo)
    assert first["gpus"] == second["gpus"] == answer["gpus"] and second["driver"] == "580"
    assert len(calls) == 1
    key[2] = ["0000:00:06.0", "0000:00:07.0"]  # another GPU appears: ask again
    host.host_facts(memo)
    assert len(calls) == 2
    assert host.host_facts(None)["gpus"] == answer["gpus"] and len(calls) == 3  # no memo: always asks
    monkeypatch.setattr(host, "_nvidia", lambda: calls.append(1) or {"nvidia_smi": "failed"})
    key[0] = "boot-2"
    assert host.host_facts(memo)["nvidia_smi"] == "failed"
    assert memo["nvidia"]["key"][0] == "boot-1"  # a failure is not remembered


def test_unchanged_snap_imports_no_pool_journal_or_subprocess(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]), str(wheelhouse[C.NS_ALPHA]))
    vault = tmp_path / "vault"
    first = ev_json(vault, "snap", "--venv", venv, "--no-caches")
    env = ev_env(vault)
    # no nvidia-smi on PATH (a GPU host has one): then nothing may start a subprocess
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep) if d and d not in _dirs_with("nvidia-smi"))
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "envvault", "snap", "--venv", str(venv), "--no-caches", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "envvault.snap.scan" in imported  # the measurement sees envvault's own imports
    for name in ("concurrent.futures", "envvault.journal", "envvault.env.dists", "email") + _BUILD_ONLY:
        assert name not in imported, f"an unchanged snap imported {name}"
    assert "subprocess" not in imported
    assert "shutil" not in imported  # PATH searched for nvidia-smi without it (env/host.py find_on_path)
    assert '"new_objects": 0' in proc.stdout
    assert first["packages"] == 2


# What only hashing files, parsing a RECORD or building a manifest needs: an unchanged environment does none
# of those (OpenSSL's hashlib alone was 4.5 ms of a 0.17 s status on the 2-core machine).
_BUILD_ONLY = ("hashlib", "_hashlib", "csv", "base64", "queue", "envvault.model.manifest", "envvault.snap.manifests")


def test_find_on_path_finds_what_shutil_which_finds_but_never_in_the_working_directory(tmp_path, monkeypatch):
    """The one PATH search (host facts, compile cache fingerprints): an executable file in the first folder
    that has one; a file that is not executable and a folder of that name are passed over; nothing found is
    None. An empty entry, which ``shutil.which`` takes for the working directory, is skipped: a snap there
    (the shell hook runs in every directory) never runs an ``nvidia-smi`` left in it."""
    import shutil
    import stat

    from envvault.env.host import find_on_path

    a, b, c, d = (tmp_path / n for n in "abcd")
    for folder in (a, b, c, d):
        folder.mkdir()
    (a / "tool").write_text("#!/bin/sh\n")  # not executable
    (b / "tool").mkdir()  # a folder
    (c / "tool").write_text("#!/bin/sh\n")
    (c / "tool").chmod(stat.S_IRWXU)
    (d / "tool").write_text("#!/bin/sh\n")
    (d / "tool").chmod(stat.S_IRWXU)
    for path in (os.pathsep.join(map(str, (a, b, c, d))), os.pathsep.join(["", str(d), "", str(c)]),
                 os.pathsep.join(map(str, (a, b))), ""):
        assert find_on_path("tool", path) == shutil.which("tool", path=path), path
    assert find_on_path("tool", os.pathsep.join(map(str, (a, b, c, d)))) == str(c / "tool")
    assert find_on_path("tool", str(a)) is None
    monkeypatch.chdir(d)  # an executable "tool" in the working directory
    for path in (os.pathsep.join(["", str(a)]), os.pathsep.join([str(a), ""])):
        assert shutil.which("tool", path=path) is not None and find_on_path("tool", path) is None, path


def test_unchanged_status_imports_nothing_a_build_needs(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]), str(wheelhouse[C.NS_ALPHA]))
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    proc = subprocess.run(  # the full command (the snap left a verdict the quick status would answer from)
        [sys.executable, "-X", "importtime", "-m", "envvault", "status", "--venv", str(venv), "--exit-code"],
        capture_output=True, text=True, env=ev_env(vault, ENVVAULT_QUICK_STATUS="0"), timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "unchanged since snapshot" in proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "envvault.snap.scan" in imported and "envvault.diff" in imported  # the measurement sees them
    for name in _BUILD_ONLY + ("shutil", "subprocess", "concurrent.futures"):
        assert name not in imported, f"an unchanged status imported {name}"


def _dirs_with(name: str) -> set[str]:
    return {d for d in os.environ.get("PATH", "").split(os.pathsep) if d and os.path.exists(os.path.join(d, name))}


def test_a_cache_snap_remembers_nvidia_smi_in_its_stat_cache(monkeypatch, tmp_path):
    """`cache snap` asks nvidia-smi once while the boot, driver and GPUs stay (its stat cache keeps the answer,
    as an environment snap's does); mocked: this machine has no GPU driver."""
    from envvault.caches.snap import take_cache_snapshot
    from envvault.env import host
    from envvault.vault.store import Vault

    calls = []
    answer = {"gpus": [{"name": "NVIDIA H200", "compute_cap": "9.0", "memory": "143771 MiB"}], "driver": "580"}
    monkeypatch.setattr(host, "_gpu_key", lambda: ["boot-1", "NVRM version 580", ["0000:00:06.0"]])
    monkeypatch.setattr(host, "_nvidia", lambda: calls.append(1) or dict(answer))
    cache = tmp_path / "inductor"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_bytes(b"compiled" * 100)
    vault = Vault.open(tmp_path / "v", create=True)
    first = take_cache_snapshot(vault, extra_dirs=[cache], discover=False, argv=["t"])
    second = take_cache_snapshot(Vault.open(tmp_path / "v"), extra_dirs=[cache], discover=False, argv=["t"])
    assert len(calls) == 1
    assert first.snapshot.host.to_dict()["gpus"] == second.snapshot.host.to_dict()["gpus"] == answer["gpus"]


def test_a_snap_answers_the_snapshot_it_committed_without_reading_it_again(tmp_path, make_venv, wheelhouse,
                                                                           monkeypatch):
    """A second snap's verdict chooses the baseline from the vault's heads, which load the snapshot just
    committed: the vault answers it as committed (the document it wrote parses to the same record, checked
    through a vault opened afresh), so the whole command parses one snapshot document (its own, as
    build_snapshot validates it) instead of three; once the file is gone the vault says so."""
    from envvault.commands import plain
    from envvault.errors import NotFoundError
    from envvault.model import snapshot as model
    from envvault.snap import take_snapshot
    from envvault.vault import store
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]), str(wheelhouse[C.NS_ALPHA]))
    path = tmp_path / "vault"
    vault = Vault.open(path, create=True)
    results = [take_snapshot(vault, venv, argv=["t"]), take_snapshot(vault, venv, argv=["t"], lock_only=True)]
    for r in results:
        assert vault.load_snapshot(r.id).snapshot is r.snapshot
        fresh = Vault.open(path).load_snapshot(r.id).snapshot
        assert fresh == r.snapshot and fresh.to_json() == r.snapshot.to_json()

    plain.snap(str(path), str(venv), "", False, True, [], True)  # the heads of the vault so far, saved
    parses = []
    real = model.parse_snapshot
    monkeypatch.setattr(model, "parse_snapshot", lambda *a, **k: parses.append(1) or real(*a, **k))
    monkeypatch.setattr(store, "parse_snapshot", model.parse_snapshot)
    plain.snap(str(path), str(venv), "", False, True, [], True)  # a second snap, as the command runs it
    assert len(parses) == 1

    import pytest

    before = len(vault.snapshot_ids())
    with pytest.raises(TypeError):  # a key JSON would write as a string: refused, not committed unlike its file
        take_snapshot(vault, venv, argv=["t"], extra={"zz_custom": {1: "a"}})
    assert len(vault.snapshot_ids()) == before

    from envvault.vault.verify import verify_vault

    damaged = results[1].id
    file = vault.backend.path("snapshots", damaged)
    file.chmod(0o644)
    file.write_bytes(b"{garbage")  # verify reads the file itself, even through the vault that committed it
    report = verify_vault(vault, [damaged])
    assert not report["ok"] and damaged in json.dumps(report)

    gone = results[0].id
    assert vault.delete_snapshot(gone)
    try:
        vault.load_snapshot(gone)
    except NotFoundError:
        pass
    else:
        raise AssertionError("a deleted snapshot was still answered")
    assert vault.load_listed(gone) is None

"""Files envvault reads from a vault's `state/` folder and from the environment itself (the restored marker,
the guard pointer, the stamp index, the restore journal) are read like the rest of the vault: only regular
files, never through a symlink, never past a limit. A FIFO or a link to /dev/zero there must neither hang
nor eat memory; status still answers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from envvault.safepaths import env_key
from tests.attacks.craft import decoy, run_cli

JOURNAL = ".envvault-restore.json"


@pytest.fixture
def snapped(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vault = tmp_path / "vault"
    rc, out, err = run_cli(["snap", "--venv", str(venv), "--no-caches"], vault=vault, timeout=120)
    assert rc == 0, err
    return vault, venv


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", ["restored", "guard", "stamp-index"])
def test_state_files_that_are_not_regular_are_not_read(snapped, tmp_path, kind, name):
    vault, venv = snapped
    key = env_key(venv)
    path = vault / "state" / {"restored": f"restored-{key}.json", "guard": f"guard-{key}.json",
                              "stamp-index": "stamp-index.json"}[name]
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)
    _folder, state = decoy(tmp_path)
    before = state()
    rc, out, err = run_cli(["status", "--venv", str(venv), "--exit-code"], vault=vault, timeout=20, memory=1 << 30)
    assert rc == 0 and "unchanged" in out, (rc, out, err)
    assert state() == before


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_journal_that_is_not_a_regular_file_neither_hangs_nor_is_read(snapped, kind):
    vault, venv = snapped
    if kind == "fifo":
        os.mkfifo(venv / JOURNAL)
    else:
        os.symlink("/dev/zero", venv / JOURNAL)
    rc, out, err = run_cli(["status", "--venv", str(venv)], vault=vault, timeout=20, memory=1 << 30)
    assert rc != 124, "status hung on the journal"
    assert "Traceback" not in err, err
    rc, out, err = run_cli(["restore", "latest", "--venv", str(venv)], vault=vault, timeout=30, memory=1 << 30)
    assert rc == 7 and len(err.strip().splitlines()) == 1 and JOURNAL in err, (rc, err)

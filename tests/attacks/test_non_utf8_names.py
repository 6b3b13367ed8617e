"""Names that are not UTF-8 (bytes a file system allows, which Python decodes with surrogate escapes): every
document of envvault's is UTF-8 JSON, so such a name is left out with a warning (a cache's file or link),
refused with one line (an environment's path), or recorded as typed, ``\\xNN`` (the command line, a message, a
variable): never an internal error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fixtures import catalogue as C
from fixtures import uv_install
from tests.evtools import assert_one_line_error, ev, ev_env

BAD = os.fsdecode(b"bad\xff")


def _run(vault, *args, env=None):
    return subprocess.run([sys.executable, "-m", "envvault", *map(os.fsdecode, args)], capture_output=True,
                          text=True, errors="backslashreplace", env=env or ev_env(vault), timeout=600)


def test_a_cache_entry_whose_name_is_not_utf8_is_left_out_with_a_warning(tmp_path):
    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    (cache / "sub" / "ok.bin").write_bytes(b"kept")
    (cache / "sub" / f"{BAD}.bin").write_bytes(b"left out")
    os.symlink(os.fsdecode(b"target\xfe"), cache / "link")  # a target that is not UTF-8
    vault = tmp_path / "vault"
    proc = _run(vault, "cache", "snap", "--no-discover", "--cache-dir", cache, "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert any("not UTF-8" in w and "left out 2 entries" in w for w in doc["warnings"]), doc["warnings"]
    out = tmp_path / "restored"
    restore = _run(vault, "cache", "restore", "--to", out)
    assert restore.returncode == 0, restore.stderr
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["ok.bin"]


def test_a_cache_root_or_a_command_line_that_is_not_utf8_is_recorded_as_typed(tmp_path):
    root = tmp_path / BAD
    root.mkdir()
    (root / "f").write_bytes(b"x")
    vault = tmp_path / "vault"
    proc = _run(vault, "cache", "snap", "--no-discover", "--cache-dir", root, "-m", os.fsdecode(b"note\xfe"), "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc
    doc = json.loads(proc.stdout)
    assert any("is not UTF-8" in w for w in doc["warnings"]), doc["warnings"]
    snap = json.loads(next((vault / "snapshots").glob("*.json")).read_bytes())
    assert snap["message"] == "note\\xfe" and any(a.endswith("bad\\xff") for a in snap["argv"]), snap["argv"]
    assert snap["caches"][0]["manifest"] is None and snap["caches"][0]["root"].endswith("bad\\xff")


def test_an_environment_whose_path_is_not_utf8_is_refused_in_one_line(tmp_path, make_venv):
    real = make_venv("uv")  # neither uv nor python -m venv makes one at such a path: a link to one is there
    venv = tmp_path / BAD
    venv.symlink_to(real)
    vault = tmp_path / "vault"
    ev(vault, "snap", "--venv", real, "--no-caches")  # a vault there: status gets as far as the path
    for args in (("snap", "--venv", venv), ("status", "--venv", venv)):
        proc = _run(vault, *args)
        assert proc.returncode == 2, proc
        assert_one_line_error(proc, "is not a UTF-8 path")


def test_a_variable_that_is_not_utf8_is_recorded_as_typed(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    vault = tmp_path / "vault"
    env = ev_env(vault)
    env_bytes = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    env_bytes[b"TORCHINDUCTOR_CACHE_DIR"] = b"/tmp/ind\xff"
    proc = subprocess.run([sys.executable, "-m", "envvault", "snap", "--venv", str(venv), "--no-caches", "--json"],
                          capture_output=True, env=env_bytes, timeout=600)
    assert proc.returncode == 0, proc.stderr
    sid = json.loads(proc.stdout)["id"]
    snap = json.loads((vault / "snapshots" / f"{sid}.json").read_bytes())
    assert snap["env"]["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/ind\\xff"
    assert ev(vault, "status", "--venv", venv, "--exit-code").returncode == 0

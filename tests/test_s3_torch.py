"""The issue's two-node run with real torch 2.13.0+cpu: node A snaps the torch venv and a compile cache into
a bucket (moto on 127.0.0.1); node B, with an empty cache, restores both into fresh paths, byte for byte, and
a second restore on node B reads no pack from the bucket."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from s3server import FaultProxy, s3_server  # noqa: F401 - the fixture
from test_s3_vault import jrun, node, run

pytestmark = pytest.mark.torch


def _content(root: Path, *, skip_installer_files: bool = False) -> dict[str, tuple]:
    """Every file (sha256 + permission bits) and symlink under root, bytecode aside."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = Path(dirpath, name)
            rel = str(full.relative_to(root))
            if name.endswith((".pyc", ".pyo")) or ".envvault" in name:
                continue
            if skip_installer_files and ".dist-info/" in rel + "/" and name in (
                    "RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"):
                continue
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(full))
            else:
                out[rel] = ("f", hashlib.sha256(full.read_bytes()).hexdigest(), st.st_mode & 0o777)
    return out


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


def test_torch_venv_across_two_nodes(s3_server, torch_venv, tmp_path):  # noqa: F811
    url = f"s3://{s3_server.bucket()}/cluster/envs"
    a, b = node(s3_server, tmp_path, "a", url), node(s3_server, tmp_path, "b", url)
    cache = tmp_path / "inductor-a"
    for i in range(40):  # a compile cache's shape: many small files, a few large ones
        f = cache / "fxgraph" / f"{i:02x}" / f"entry{i}"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(os.urandom(2048 if i % 10 else 3 << 20))
    sid = jrun(a, "snap", "--no-caches", "--venv", torch_venv, "-m", "node A")["id"]
    csid = jrun(a, "cache", "snap", "--no-discover", "--cache-dir", cache, "--venv", torch_venv)["id"]

    restored = tmp_path / "restored"
    out = run(b, "restore", sid, "--into", restored)
    assert "verified" in out.stdout, out.stdout + out.stderr
    want, got = _content(_site(torch_venv), skip_installer_files=True), _content(_site(restored),
                                                                                   skip_installer_files=True)
    assert want.keys() == got.keys(), sorted(want.keys() ^ got.keys())[:20]
    assert want == got, [k for k in want if want[k] != got[k]][:20]
    proc = subprocess.run([str(restored / "bin" / "python"), "-c",
                           "import torch; print(torch.__version__, float(torch.ones(3, 3).sum()))"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["2.13.0+cpu", "9.0"], proc.stderr[-2000:]

    out = run(b, "cache", "restore", csid, "--to", tmp_path / "inductor-b", "--venv", restored)
    assert _content(tmp_path / "inductor-b") == _content(cache), out.stdout + out.stderr

    # Second restore on node B: every pack read is refused by the proxy, so it can only come from B's cache.
    proxy = FaultProxy(s3_server.port, rate=0.0)
    proxy.refuse = b".pack HTTP/1.1"
    try:
        b2 = node(s3_server, tmp_path, "b", url, endpoint=proxy.url)
        out = run(b2, "restore", sid, "--into", tmp_path / "again")
        assert "verified" in out.stdout
        assert proxy.counts["refused"] == 0 and proxy.counts["connections"] > 0
    finally:
        proxy.close()
    assert _content(_site(tmp_path / "again"), skip_installer_files=True) == want

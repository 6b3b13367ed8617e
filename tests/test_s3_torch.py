"""The issue's two-node run with real torch 2.13.0+cpu: node A snaps the torch venv and a compile cache into
a bucket (moto on 127.0.0.1); node B, with an empty cache, restores both into fresh paths, byte for byte, and
a second restore on node B reads no pack from the bucket."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fixtures.trees import installed_content
from s3server import FaultProxy
from test_s3_vault import jrun, node, run

pytestmark = pytest.mark.torch


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


def test_torch_venv_across_two_nodes(s3_server, torch_venv, tmp_path):
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
    want, got = installed_content(_site(torch_venv), skip_installer_files=True), installed_content(_site(restored),
                                                                                   skip_installer_files=True)
    assert want.keys() == got.keys(), sorted(want.keys() ^ got.keys())[:20]
    assert want == got, [k for k in want if want[k] != got[k]][:20]
    proc = subprocess.run([str(restored / "bin" / "python"), "-c",
                           "import torch; print(torch.__version__, float(torch.ones(3, 3).sum()))"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["2.13.0+cpu", "9.0"], proc.stderr[-2000:]

    out = run(b, "cache", "restore", csid, "--to", tmp_path / "inductor-b", "--venv", restored)
    assert installed_content(tmp_path / "inductor-b") == installed_content(cache), out.stdout + out.stderr

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
    assert installed_content(_site(tmp_path / "again"), skip_installer_files=True) == want

"""End to end with real torch 2.13.0+cpu: compile cold, snap the caches, delete them, restore, compile warm.

Each compile runs in a new process of the ``torch_venv`` fixture's interpreter. Evidence is torch's own
counters (``torch._dynamo.utils.counters["inductor"]``) and the C++ builds Inductor starts: the child
wraps ``CppBuilder.build`` (torch's one entry point that runs the compiler) to record each target it
builds, then calls the original. A warm compile may still run the preprocessor (``header.i``: Inductor
hashes the preprocessed header on every load); it must build no ``.so`` and no precompiled header.

Inductor keeps precompiled headers under its default root even when ``TORCHINDUCTOR_CACHE_DIR`` is set,
so TMPDIR is pointed into the test's folder too and both roots are archived and restored.
"""

from __future__ import annotations

import getpass
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.evtools import ev, ev_env, ev_json

pytestmark = pytest.mark.torch

CHILD = r"""
import json, os, sys, time
import torch
from torch._dynamo.utils import counters
import torch._inductor.cpp_builder as cpp_builder

builds = []
_build = cpp_builder.CppBuilder.build
def build(self, *args, **kwargs):
    builds.append(os.path.basename(self.get_target_file_path()))
    return _build(self, *args, **kwargs)
cpp_builder.CppBuilder.build = build

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16))
step = torch.compile(model)
with torch.no_grad():
    out = step(torch.randn(8, 64))
print(json.dumps({
    "torch": str(torch.__version__),
    "inductor": {k: v for k, v in counters["inductor"].items()},
    "builds": builds,
    "checksum": float(out.sum()),
}))
"""


def _compile(python: Path, env: dict) -> dict:
    proc = subprocess.run([str(python), "-c", CHILD], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _so_files(*roots: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for r in roots for p in r.rglob("*") if p.suffix in (".so", ".gch")}


def test_restored_cache_compiles_warm_in_a_new_process(tmp_path, torch_venv):
    python = torch_venv / "bin" / "python"
    vault = tmp_path / "vault"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    ic = tmp_path / "inductor"
    env = {k: v for k, v in ev_env(vault).items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(ic), TMPDIR=str(tmp), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), CUDA_CACHE_PATH=str(tmp_path / "nv"))
    default_root = tmp / f"torchinductor_{getpass.getuser()}"

    cold = _compile(python, env)
    assert cold["torch"] == "2.13.0+cpu"
    assert cold["inductor"].get("fxgraph_cache_miss", 0) > 0 and cold["inductor"].get("fxgraph_cache_hit", 0) == 0
    assert any(b.endswith(".so") for b in cold["builds"]), cold["builds"]  # the instrument sees real builds
    built = _so_files(ic, default_root)
    assert any(p.endswith(".gch") for p in built)  # the precompiled header, under the default root

    out = ev_json(vault, "cache", "snap", "--venv", torch_venv, "-m", "cold compile", env=env)
    roots = {c["root"]: c for c in out["caches"]}
    assert set(roots) == {str(ic), str(default_root / "precompiled_headers")}, roots
    for c in out["caches"]:
        assert c["warnings"] == [] and c["fingerprint"]["torch"]["version"] == "2.13.0+cpu"
    assert roots[str(ic)]["entries"]["fxgraph"] >= 1

    shutil.rmtree(ic)
    shutil.rmtree(default_root)
    done = ev_json(vault, "cache", "restore", out["id"], "--venv", torch_venv, env=env)
    assert all(c["mismatches"] == [] for c in done["caches"]), done  # same torch: nothing to warn about
    restored = _so_files(ic, default_root)
    assert restored.keys() == built.keys()

    warm = _compile(python, env)
    assert warm["inductor"].get("fxgraph_cache_hit", 0) > 0, warm
    assert warm["inductor"].get("fxgraph_cache_miss", 0) == 0, warm
    assert [b for b in warm["builds"] if b.endswith((".so", ".gch", ".o"))] == [], warm["builds"]
    assert _so_files(ic, default_root) == restored  # no kernel or header was rebuilt or added
    assert warm["checksum"] == pytest.approx(cold["checksum"])


def test_restored_cache_without_the_precompiled_header_rebuilds_it(tmp_path, torch_venv):
    """The control: the counters and the build record do see a rebuild when part of the cache is missing."""
    python = torch_venv / "bin" / "python"
    vault = tmp_path / "vault"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    ic = tmp_path / "inductor"
    env = {k: v for k, v in ev_env(vault).items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(ic), TMPDIR=str(tmp), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), CUDA_CACHE_PATH=str(tmp_path / "nv"))
    default_root = tmp / f"torchinductor_{getpass.getuser()}"
    _compile(python, env)
    out = ev_json(vault, "cache", "snap", "--venv", torch_venv, env=env)
    shutil.rmtree(ic)
    shutil.rmtree(default_root)
    ev(vault, "cache", "restore", out["id"], "--venv", torch_venv, "--root", ic, env=env)  # Inductor root only
    warm = _compile(python, env)
    assert warm["inductor"].get("fxgraph_cache_hit", 0) > 0
    assert any(b.endswith(".gch") for b in warm["builds"]), warm["builds"]

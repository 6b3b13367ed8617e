"""The checkpoint CLI: ``inspect`` in a Python without torch, the zero-code ``.pth`` hook, and checkpoints
standing for their snapshot in ``diff`` and ``restore``.

The torch-less Python is a venv of the base interpreter with nothing installed but links to envvault and
its dependencies (no torch): the ``envvault`` a user has in their shell, beside a training venv.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch  # a missing torch must fail this module, not skip it
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from envvault.torch.hook import LIBS_NAME, PTH_NAME, link_runtime  # noqa: E402
from tests.evtools import assert_one_line_error, ev  # noqa: E402
from fixtures import build_wheel, make_venv, site_packages, uv_install  # noqa: E402
from fixtures.checkpoints import (  # noqa: E402
    EXPECTED_CALLS,
    HOSTILE_KINDS,
    hostile_pickle,
    legacy_with_pickle,
    torch_zip_with_pickle,
)
from fixtures.machine import cpython  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

OTHER_PYTHON = os.environ.get("ENVVAULT_NOTORCH_PYTHON") or str(cpython("3.12"))


@pytest.fixture(scope="module")
def notorch(tmp_path_factory) -> Path:
    """The python of a venv that has envvault (and click, blake3, zstandard...) but no torch."""
    venv = make_venv(tmp_path_factory.mktemp("notorch") / "venv", "venv", python=sys._base_executable)
    site = site_packages(venv)
    (site / "envvault_deps.pth").write_text(f"{link_runtime(site / 'envvault_deps.libs')}\n")
    python = venv / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('torch') is None, "
                            "u.find_spec('envvault') is not None)"], capture_output=True, text=True, env=_env())
    assert probe.stdout.split() == ["True", "True"], probe.stderr
    return python


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "ENVVAULT_STAMP", "ENVVAULT_HOME")}
    env.update(extra)
    return env


def _cli(python: Path, vault: Path, *args, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(python), "-m", "envvault", "--vault", str(vault), *map(str, args)],
                          capture_output=True, text=True, env=_env(), timeout=600, **kw)
    if check:
        assert proc.returncode == 0, f"envvault {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _inspect(python: Path, path: Path) -> dict:
    return json.loads(_cli(python, Path("/nonexistent"), "inspect", path, "--json").stdout)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


STAMP = {"format": 1, "snapshot": "ab" * 32, "snapshot_lock_only": False, "fingerprint": "cd" * 32,
         "torch": str(torch.__version__), "cuda": None, "python": "3.11.7", "host": "trainer-7",
         "argv": ["train.py", "--lr", "0.1"], "cwd": "/runs/7", "venv": "/venvs/train",
         "time": "2026-11-29T12:00:00.000Z", "env": {"CUDA_VISIBLE_DEVICES": "0"},
         "git": {"root": "/runs/7", "commit": "1" * 40, "branch": "main", "dirty": True},
         "drift": {"fingerprint": "ef" * 32,
                   "changed": [{"name": "torch", "old": "2.13.0+cpu", "new": "2.11.0", "other_build": False}]},
         "warnings": []}


def test_inspect_prints_the_stamp_and_all_non_tensor_content(notorch, tmp_path):
    model = _model()
    big = {f"layer{i}.weight": torch.zeros(2, 2) for i in range(12)}
    ckpt = {"model": model.state_dict(), "big": big, "epoch": 7, "args": argparse.Namespace(lr=0.1, name="run-7"),
            "config": {"layers": [4, 8, 2], "dropout": 0.1}, "envvault": STAMP}
    torch.save(ckpt, tmp_path / "step_7.pt")
    text = _cli(notorch, tmp_path / "v", "inspect", tmp_path / "step_7.pt").stdout
    for needle in ("torch-zip", "stamp (key)", STAMP["snapshot"], "trainer-7", "train.py --lr 0.1", "dirty",
                   "torch 2.13.0+cpu -> 2.11.0", '"epoch": 7', "argparse.Namespace", '"run-7"', '"dropout": 0.1',
                   '"0.weight": "tensor[8, 4] float32"', "<12 tensors>"):
        assert needle in text, (needle, text)
    doc = _inspect(notorch, tmp_path / "step_7.pt")
    assert doc["stamp"] == STAMP and doc["content"]["epoch"] == 7
    assert doc["content"]["args"]["state"] == {"lr": 0.1, "name": "run-7"}
    assert doc["content"]["big"]["layer3.weight"] == {"tensor": [2, 2], "dtype": "float32"}

    torch.save(model.state_dict(), tmp_path / "plain.pt")
    torch.save({"model": model.state_dict()}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    save_file({"w": torch.ones(3)}, tmp_path / "w.safetensors", metadata={"format": "pt"})
    dcp.save({"m": model.state_dict()}, checkpoint_id=str(tmp_path / "dcp"))
    expected = {"plain.pt": "torch-zip", "legacy.pt": "torch-legacy", "w.safetensors": "safetensors", "dcp": "dcp"}
    for name, fmt in expected.items():
        doc = _inspect(notorch, tmp_path / name)
        assert doc["format"] == fmt and doc["stamp"] is None and "content" in doc, name
    assert "stamp: none" in _cli(notorch, tmp_path / "v", "inspect", tmp_path / "plain.pt").stdout


def test_inspect_reports_hostile_pickles_and_runs_nothing(notorch, tmp_path):
    real = tmp_path / "real.pt"
    torch.save({"model": _model().state_dict(), "epoch": 1}, real)
    for kind in HOSTILE_KINDS:
        for container in ("zip", "legacy"):
            marker = tmp_path / f"pwned-{kind.replace('.', '_')}-{container}"
            payload = hostile_pickle(kind, marker)
            path = tmp_path / f"evil-{kind.replace('.', '_')}-{container}.pt"
            if container == "zip":
                torch_zip_with_pickle(real, path, payload)
            else:
                path.write_bytes(legacy_with_pickle(payload))
            proc = _cli(notorch, tmp_path / "v", "inspect", path, "--json")
            doc = json.loads(proc.stdout)
            assert any(EXPECTED_CALLS[kind] in f for f in doc["findings"]), (kind, doc["findings"])
            assert doc["content"]["x"]["blocked"] is True and doc["content"]["epoch"] == 1
            assert len(proc.stderr.strip().splitlines()) == 1 and "none ran" in proc.stderr
            text = _cli(notorch, tmp_path / "v", "inspect", path).stdout
            assert "findings" in text and EXPECTED_CALLS[kind] in text
            assert not marker.exists(), f"{kind} in {container}: the payload ran"


def _wheel(out: Path, name: str, version: str = "1.0") -> Path:
    return build_wheel(out, name, version, {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode()})


TRAIN = """\
import argparse, os, torch
model = torch.nn.Linear(4, 4)
os.makedirs("ckpt", exist_ok=True)
args = argparse.Namespace(lr=0.1, name="zero-code")
torch.save({"model": model.state_dict(), "epoch": 3, "args": args, "config": {"layers": [4, 4]}}, "ckpt/step_3.pt")
torch.save(model.state_dict(), "ckpt/weights.pt")
torch.save(model, "ckpt/module.pt")
torch.save({"model": model.state_dict()}, "ckpt/legacy.pt", _use_new_zipfile_serialization=False)
"""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


def _full_snapshot(python: Path, vault: Path, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = json.loads(_cli(python, vault, "list", "--all", "--json").stdout)["snapshots"]
        full = [r["id"] for r in rows if not r["lock_only"]]
        if full:
            return full[0]
        time.sleep(0.5)
    raise AssertionError(f"no full snapshot after {timeout} s: {(vault / 'state' / 'stamp-snap.log').read_text()}")


def test_zero_code_stamping_with_the_hook(notorch, torch_venv, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["cp", "-a", str(torch_venv), str(venv)], check=True)  # the shared venv must not change
    vault = tmp_path / "vault"
    site = site_packages(venv)
    hook = json.loads(_cli(notorch, vault, "torch", "install-hook", "--venv", venv, "--json").stdout)
    assert hook["pth"] == str(site / PTH_NAME) and hook["libs"] == str(site / LIBS_NAME)  # torch_venv has no envvault
    line = (site / PTH_NAME).read_text()
    assert line.count("\n") == 1 and line.startswith('import os; os.environ.get("ENVVAULT_STAMP") == "1" and ')

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN)
    (proj / "README").write_text("run\n")
    _git(proj, "init", "-q")
    _git(proj, "add", ".")
    _git(proj, "commit", "-q", "-m", "start")
    (proj / "README").write_text("edited\n")  # a dirty work tree
    python = venv / "bin" / "python"
    run = subprocess.run([str(python), "train.py"], cwd=proj, capture_output=True, text=True, timeout=600,
                         env=_env(ENVVAULT_STAMP="1", ENVVAULT_HOME=str(vault)))
    assert run.returncode == 0 and run.stderr == "", run.stderr

    docs = {p.name: _inspect(notorch, p) for p in sorted((proj / "ckpt").iterdir())}
    stamps = {name: d["stamp"] for name, d in docs.items()}
    assert {d["stamp_source"] for d in docs.values()} == {"key", "zip-record"}
    sid = stamps["step_3.pt"]["snapshot"]
    assert sid and all(s["snapshot"] == sid for s in stamps.values()), stamps
    s = stamps["step_3.pt"]
    assert s["venv"] == str(venv) and s["argv"] == ["train.py"] and s["cwd"] == str(proj)
    assert s["torch"] == str(torch.__version__) and s["drift"] is None and s["warnings"] == []
    assert s["git"] == {"root": str(proj), "commit": _git(proj, "rev-parse", "HEAD"), "branch": _git(
        proj, "rev-parse", "--abbrev-ref", "HEAD"), "dirty": True}
    assert docs["step_3.pt"]["content"]["args"]["state"] == {"lr": 0.1, "name": "zero-code"}
    text = _cli(notorch, vault, "inspect", proj / "ckpt" / "step_3.pt").stdout
    assert sid in text and '"epoch": 3' in text and "zero-code" in text

    # The stamp's lock-only snapshot is already there; the files follow in the background.
    full = _full_snapshot(notorch, vault)
    assert full != sid
    diff = json.loads(_cli(notorch, vault, "diff", proj / "ckpt" / "weights.pt", "current", "--venv", venv,
                           "--json").stdout)
    assert diff["packages"] == {"added": [], "removed": [], "changed": []}

    # The environment moves on; the checkpoint still names the one it came from.
    uv_install(venv, _wheel(tmp_path / "w", "afterpkg"))
    proc = _cli(notorch, vault, "diff", proj / "ckpt" / "step_3.pt", "current", "--venv", venv, "--exit-code",
                check=False)
    assert proc.returncode == 1 and "afterpkg" in proc.stdout, proc.stdout + proc.stderr
    restored = json.loads(_cli(notorch, vault, "restore", proj / "ckpt" / "module.pt", "--no-backup",
                               "--json").stdout)
    assert restored["restored"] == full and restored["verified"] is True, restored  # the full one, same fingerprint
    assert not list(site.glob("afterpkg*")) and (site / PTH_NAME).exists()

    # Without ENVVAULT_STAMP the hook imports nothing and stamps nothing.
    shutil.rmtree(proj / "ckpt")
    plain = subprocess.run([str(python), "-X", "importtime", "train.py"], cwd=proj, capture_output=True,
                           text=True, env=_env(ENVVAULT_HOME=str(vault)))
    assert plain.returncode == 0 and "envvault" not in plain.stderr, plain.stderr[-2000:]
    assert _inspect(notorch, proj / "ckpt" / "step_3.pt")["stamp"] is None

    out = _cli(notorch, vault, "torch", "uninstall-hook", "--venv", venv).stdout
    assert PTH_NAME in out and not (site / PTH_NAME).exists() and not (site / LIBS_NAME).exists()
    assert "no stamping hook" in _cli(notorch, vault, "torch", "uninstall-hook", "--venv", venv).stdout


def test_checkpoint_arguments_that_name_no_snapshot_fail_in_one_line(tmp_path):
    vault = tmp_path / "vault"
    ev(vault, "snap", "--venv", make_venv(tmp_path / "venv", "venv", python=sys._base_executable), "--lock-only")
    torch.save({"epoch": 1}, tmp_path / "plain.pt")
    torch.save({"epoch": 1, "envvault": STAMP}, tmp_path / "elsewhere.pt")
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    for args in (("restore", tmp_path / "plain.pt"), ("diff", tmp_path / "plain.pt", "current")):
        assert_one_line_error(ev(vault, *args, check=False), "plain.pt", "no envvault stamp")
    for args in (("restore", tmp_path / "elsewhere.pt"), ("diff", "latest", tmp_path / "elsewhere.pt")):
        proc = ev(vault, *args, check=False)
        assert_one_line_error(proc, STAMP["snapshot"], str(vault))
        assert proc.returncode == 4
    proc = ev(vault, "diff", tmp_path / "notes.txt", "current", check=False)
    assert_one_line_error(proc, "notes.txt", "not a checkpoint")


def test_install_hook_refuses_a_python_that_cannot_load_envvault(tmp_path):
    if not Path(OTHER_PYTHON).exists():
        pytest.fail(f"{OTHER_PYTHON} (another Python minor version) is needed; set ENVVAULT_NOTORCH_PYTHON")
    venv = make_venv(tmp_path / "venv", "venv", python=OTHER_PYTHON)
    proc = ev(tmp_path / "vault", "torch", "install-hook", "--venv", venv, check=False)
    assert proc.returncode == 3
    assert_one_line_error(proc, "cannot import envvault", "pip install envvault")
    assert not (site_packages(venv) / PTH_NAME).exists()


def test_cli_wiring():
    proc = ev(Path("/nonexistent"), "--help")
    assert "inspect" in proc.stdout and "torch" in proc.stdout
    assert "install-hook" in ev(Path("/nonexistent"), "torch", "--help").stdout

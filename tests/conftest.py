"""Shared pytest fixtures: the wheel catalogue (built once per session) and a venv factory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Make the repository's top-level packages (envvault, fixtures) importable however pytest is started.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from fixtures import build_catalogue  # noqa: E402
from fixtures import make_venv as _make_venv  # noqa: E402


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fixture catalogue (``fixtures.catalogue``), built once: ``{key: wheel path}``."""
    return build_catalogue(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture
def make_venv(tmp_path: Path):
    """Factory ``make_venv(kind="uv", python=None, *, with_pip=False, name=None) -> Path`` that creates
    a fresh venv under this test's tmp_path (see ``fixtures.venvs.make_venv``)."""
    count = 0

    def factory(kind: str = "uv", python: str | Path | None = None, *, with_pip: bool = False,
                name: str | None = None) -> Path:
        nonlocal count
        count += 1
        return _make_venv(tmp_path / (name or f"venv{count}"), kind, python, with_pip=with_pip)

    return factory


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """One moto S3 server on 127.0.0.1 for the whole session (``tests/s3server.py``): the one ``.ci/run``
    started (``ENVVAULT_TEST_S3_URL``), else one started by the first test that asks; tests stay apart by
    making a bucket each (``s3_server.bucket()``)."""
    import os

    from s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log", os.environ.get("ENVVAULT_TEST_S3_URL"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aws(s3_server, monkeypatch):
    """The moto server with this process's AWS variables pointing at it (and no profile, region or token of
    the machine's in the way): for tests that open an ``S3Backend`` in the test process itself."""
    for k in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture(scope="session")
def torch_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with real torch 2.13.0+cpu and numpy, installed by pip from this machine's disk.

    Shared by the whole session: tests must not change it (copy it or make their own). Set
    ``ENVVAULT_TEST_TORCH_VENV`` to reuse a venv built earlier. Without torch the tests fail, never skip.
    """
    import os
    import subprocess

    given = os.environ.get("ENVVAULT_TEST_TORCH_VENV")
    if given:
        return Path(given)
    venv = tmp_path_factory.mktemp("torch") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "torch==2.13.0", "numpy"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"cannot install torch 2.13.0 (tests need it): {proc.stderr[-2000:]}"
    return venv


@pytest.fixture(scope="session", autouse=True)
def _isolated_compile_caches(tmp_path_factory: pytest.TempPathFactory):
    """Every snap archives compile caches by default: point them (and the temp dir, where torch keeps
    precompiled headers) into this session's tmp, so tests never archive the machine's own caches.
    Tests that exercise caches set their own locations on top of these."""
    import os

    root = tmp_path_factory.mktemp("compile-caches")
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME",
                                             "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH", "TMPDIR")}
    (root / "tmp").mkdir()
    os.environ.update({
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TRITON_CACHE_DIR": str(root / "triton"),
        "TRITON_HOME": str(root / "tritonhome"),
        "TORCH_EXTENSIONS_DIR": str(root / "ext"),
        "CUDA_CACHE_PATH": str(root / "nv"),
        "TMPDIR": str(root / "tmp"),
    })
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

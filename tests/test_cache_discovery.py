"""envvault.caches: discovery against real torch, the walk of a real H200 cache, fingerprints and compare.

Tests marked ``torch`` need torch 2.13.0+cpu in the interpreter running the tests (the dev venv); they
fail, never skip, without it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

from envvault.caches import (
    CacheFile,
    Fingerprint,
    GpuInfo,
    compare,
    discover_caches,
    fingerprint_from_tree,
    fingerprint_venv,
    stable_read,
    walk_cache,
)
from envvault.caches.discover import inductor_cache_dir, torch_extensions_dir, triton_cache_dir
from envvault.caches.fingerprint import compile_env
from envvault.errors import CorruptError, NotFoundError
from fixtures.machine import H200_CACHE_TAR

H200_TAR = H200_CACHE_TAR
VENV = Path(sys.prefix)


@pytest.fixture(scope="session")
def torch_version() -> str:
    """torch's version in the interpreter running the tests; fails (never skips) when torch is missing."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"torch 2.13.0+cpu is needed by this test and missing from {sys.executable}")
    assert version == "2.13.0+cpu", f"these tests expect torch 2.13.0+cpu, found {version}"
    return version


@pytest.fixture(scope="session")
def h200_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real H200 Inductor root from shared/data, extracted once (read-only by convention)."""
    assert H200_TAR.is_file(), f"missing {H200_TAR}"
    dest = tmp_path_factory.mktemp("h200")
    with open(H200_TAR, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(dest, filter="data")
    return dest / "torchinductor_root"


def _clean_env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(changes)
    return env


# What torch itself says, one interpreter for all cases: cache_dir() reads os.environ on every call, and
# tempfile.tempdir = None drops gettempdir's memo, so each case sees exactly its own environment.
# makedirs is disabled after the import so that the default case creates nothing in the real /tmp.
_TORCH_SAYS = """
import json, os, sys, tempfile
from torch._inductor.runtime.cache_dir_utils import cache_dir
os.makedirs = lambda *args, **kwargs: None
out = []
for env in json.loads(sys.stdin.read()):
    os.environ.clear(); os.environ.update(env); tempfile.tempdir = None
    out.append(cache_dir())
print(json.dumps(out))
"""


@pytest.mark.torch
def test_inductor_root_matches_torch_under_each_env(torch_version: str, tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    cases = [
        _clean_env(),
        _clean_env(TMPDIR=str(tmpdir)),
        _clean_env(TMPDIR=str(tmp_path / "missing"), TEMP=str(tmpdir)),  # unusable TMPDIR is passed over
        _clean_env(TMPDIR=str(tmpdir), LOGNAME='dom\\ain:me*"x"<y>|z?/w'),  # torch's sanitising
        _clean_env(TMPDIR=str(tmpdir), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "explicit")),
        _clean_env(TMPDIR=str(tmpdir), TORCHINDUCTOR_CACHE_DIR="relative/root"),  # abspath against cwd
    ]
    done = subprocess.run(
        [sys.executable, "-c", _TORCH_SAYS], input=json.dumps(cases), capture_output=True, text=True,
        cwd=tmp_path, check=True, env=_clean_env(TMPDIR=str(tmpdir)),  # torch's import creates its root
    )  # fmt: skip
    torch_says = [Path(p) for p in json.loads(done.stdout)]
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        ours = [inductor_cache_dir(env)[0] for env in cases]
        discovered = [discover_caches(env)[0] for env in cases]
    finally:
        os.chdir(old)
    assert ours == torch_says
    assert [loc.path for loc in discovered] == torch_says
    assert all(loc.kind == "inductor" for loc in discovered)
    assert torch_says[1].parent == tmpdir and torch_says[2].parent == tmpdir
    assert torch_says[3] == tmpdir / "torchinductor_dom_ain_me__x__y__z__w"
    assert torch_says[4] == tmp_path / "explicit"
    assert torch_says[5] == tmp_path / "relative" / "root"
    assert discovered[4].reason == "TORCHINDUCTOR_CACHE_DIR"
    assert discovered[1].reason == "default, in the temp dir ($TMPDIR)"


@pytest.mark.torch
def test_use_torch_python_asks_the_venv_and_creates_nothing(torch_version: str, tmp_path: Path) -> None:
    env = _clean_env(TMPDIR=str(tmp_path), LOGNAME="asker")
    locations = discover_caches(env, use_torch_python=Path(sys.executable))
    assert locations[0].path == tmp_path / "torchinductor_asker"
    assert locations[0].reason == f"reported by {sys.executable}"
    assert not locations[0].exists and not (tmp_path / "torchinductor_asker").exists()


def test_triton_precedence(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert triton_cache_dir({"HOME": str(home)})[0] == home / ".triton" / "cache"
    assert triton_cache_dir({"HOME": str(home), "TRITON_HOME": "/srv/th"})[0] == Path("/srv/th/.triton/cache")
    both = {"HOME": str(home), "TRITON_HOME": "/srv/th", "TRITON_CACHE_DIR": "/srv/tc"}
    assert triton_cache_dir(both) == (Path("/srv/tc"), "TRITON_CACHE_DIR")
    # Blank TRITON_CACHE_DIR: Triton <= 3.2 falls back to the default (>= 3.3 refuses to compile).
    assert triton_cache_dir({"HOME": str(home), "TRITON_CACHE_DIR": " "})[0] == home / ".triton" / "cache"


def test_triton_matches_real_triton(tmp_path: Path) -> None:
    """Against real Triton 3.6.0 (what the H200 runs), installed by pip into a folder of its own: a CPU
    torch does not bring Triton, and this test must not skip."""
    site = tmp_path / "site"
    probe = subprocess.run([sys.executable, "-c", "import triton.knobs"], capture_output=True)
    if probe.returncode != 0:
        got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                              "triton==3.6.0"], capture_output=True, text=True)
        assert got.returncode == 0, f"cannot install triton 3.6.0 for this test: {got.stderr[-1500:]}"
    for env in ({}, {"TRITON_HOME": str(tmp_path)}, {"TRITON_CACHE_DIR": str(tmp_path / "c")}):
        full = _clean_env(HOME=str(tmp_path / "h"), **env)
        if site.exists():
            full["PYTHONPATH"] = str(site)
        said = subprocess.run(
            [sys.executable, "-c", "from triton import knobs; print(knobs.cache.dir)"],
            env=full, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert triton_cache_dir(full)[0] == Path(said)


def test_other_locations_and_extra_dirs(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    locations = discover_caches(env, extra=[tmp_path / "mine", Path("~/x")])
    assert [loc.kind for loc in locations] == ["inductor", "triton", "torch_extensions", "cuda", "user", "user"]
    assert locations[2].path == Path(os.path.realpath(tmp_path / ".cache" / "torch_extensions"))
    assert locations[3].path == tmp_path / ".nv" / "ComputeCache"
    assert locations[5].path == Path(os.path.expanduser("~/x"))
    assert torch_extensions_dir({**env, "XDG_CACHE_HOME": "/xdg"})[0] == Path("/xdg/torch_extensions")
    assert torch_extensions_dir({**env, "TORCH_EXTENSIONS_DIR": "/ext"})[0] == Path("/ext")
    assert discover_caches({**env, "CUDA_CACHE_PATH": "/cc"})[3].path == Path("/cc")
    # The same folder twice is listed once.
    assert len(discover_caches(env, extra=[tmp_path / ".nv" / "ComputeCache"])) == 4


def test_walk_real_h200_tree(h200_root: Path) -> None:
    files = walk_cache(h200_root)
    assert len(files) == 671
    assert [f.path for f in files] == sorted(f.path for f in files)
    assert sum(f.path.startswith("triton/0/") for f in files) == 577
    assert sum(f.path.startswith("fxgraph/") for f in files) == 5
    assert sum(f.path.endswith(".so") for f in files) == 1
    assert not any(f.is_dir or f.is_symlink for f in files)
    assert sum(f.size for f in files) > 35_000_000


def test_walk_leaves_out_what_is_mid_write(h200_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "fxgraph" / "ab").mkdir(parents=True)
    (root / "fxgraph" / "ab" / "entry").write_bytes(b"x" * 10)
    (root / "fxgraph" / "ab" / f".{os.getpid()}.140001.tmp").write_bytes(b"half")  # write_atomic
    (root / "locks").mkdir()
    (root / "locks" / "abc.lock").write_bytes(b"")
    kernel = root / "triton" / "0" / "KERNELHASH"
    tmp_put = kernel / f"tmp.pid_{os.getpid()}_0e8c2f4e-3c4a-4b5b-9c1d-2f8a5e6b7c8d"  # FileCacheManager.put
    tmp_put.mkdir(parents=True)
    (tmp_put / "k.cubin").write_bytes(b"partial")
    (kernel / "k.json").write_text("{}")
    bundle = root / "triton" / "0" / "tmp.0e8c2f4e-3c4a-4b5b-9c1d-2f8a5e6b7c8d"  # TritonBundler
    bundle.mkdir()
    (bundle / "k.ptx").write_text("ptx")
    (root / "empty").mkdir()
    (root / "inside").symlink_to("fxgraph/ab/entry")
    (root / "outside").symlink_to("/etc/passwd")
    (root / "sneaky").symlink_to("../../elsewhere")
    files = {f.path: f for f in walk_cache(root)}
    assert set(files) == {
        "empty", "fxgraph/ab/entry", "inside", "locks", "outside", "sneaky", "triton/0/KERNELHASH/k.json",
    }  # fmt: skip
    assert files["locks"].is_dir and files["empty"].is_dir
    assert files["fxgraph/ab/entry"].size == 10
    assert files["inside"].is_symlink and files["inside"].target == "fxgraph/ab/entry"
    assert not files["inside"].escapes_root
    assert files["outside"].escapes_root and files["sneaky"].escapes_root
    with pytest.raises(NotFoundError):
        walk_cache(tmp_path / "nope")


def test_stable_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    entry = next(f for f in walk_cache(tmp_path) if f.path == "f")
    assert stable_read(path, entry) == b"abc"
    assert stable_read(path, os.stat(path)) == b"abc"
    path.write_bytes(b"abcd")  # rewritten by a compile since the walk
    assert stable_read(path, entry) is None
    st = os.stat(path)
    replacement = tmp_path / "g"
    replacement.write_bytes(b"wxyz")
    os.utime(replacement, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(replacement, path)  # same size and mtime, another file
    assert stable_read(path, st) is None  # an os.stat_result also pins the inode
    fresh = os.stat(path)
    assert stable_read(path, fresh) == b"wxyz"
    path.unlink()
    assert stable_read(path, fresh) is None
    (tmp_path / "link").symlink_to("elsewhere")
    assert stable_read(tmp_path / "link", fresh) is None


@pytest.mark.torch
def test_fingerprint_of_the_dev_venv_matches_torch(torch_version: str) -> None:
    fp = fingerprint_venv(VENV, env={"PATH": "", "TORCHINDUCTOR_MAX_AUTOTUNE": "1", "HOME": "/x"}, exact=True)
    assert fp.origin == "venv" and fp.torch_version == torch_version
    assert fp.torch_cuda is None and fp.torch_hip is None and len(fp.torch_git_version or "") == 40
    assert len(fp.torch_record or "") == 64
    assert fp.python_version and fp.python_version.startswith(f"{sys.version_info[0]}.{sys.version_info[1]}")
    assert fp.gpus == ()  # no nvidia-smi on PATH
    assert dict(fp.env) == {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}
    # The exact mode equals Inductor's own torch_key() and the hash it writes in cache entries.
    done = subprocess.run(
        [sys.executable, "-c",
         "import torch\n"
         "from torch._inductor.codecache import torch_key, FxGraphCachePickler\n"
         "k = torch_key()\n"
         "p = FxGraphCachePickler(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()))\n"
         "print(k.hex(), p.get_hash(k))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    key, key_hash = done.stdout.split()
    assert (fp.torch_source_key, fp.torch_key_hash) == (key, key_hash)
    assert Fingerprint.from_dict(json.loads(json.dumps(fp.to_dict()))) == fp
    cheap = fingerprint_venv(VENV, env={}, probe_gpu=False)
    assert cheap.torch_source_key is None and cheap.gpus is None and cheap.torch_record == fp.torch_record


def test_fingerprint_from_the_h200_tree(h200_root: Path) -> None:
    fp = fingerprint_from_tree(h200_root)
    assert fp.origin == "tree"
    assert (fp.torch_version, fp.torch_cuda, fp.triton_version) == ("2.11.0+cu130", "13.0", "3.6.0")
    assert fp.torch_git_version == "70d99e998b4955e0049d13a98d77ae1b14db1f45"
    assert fp.torch_key_hash == "bhbxfhoxf5hkmujdjpm36xihaazrhcnnqhkwzuzb2mhe4uyuamb"
    assert fp.gpus == (GpuInfo(name="NVIDIA H200", compute_cap="9.0"),)
    assert fp.python_version == "3.12"
    assert fp.env_scope == "repro" and dict(fp.env)["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/torchinductor_root"
    assert Fingerprint.from_dict(fp.to_dict()) == fp


def test_fingerprint_from_a_triton_cache_root(h200_root: Path, tmp_path: Path) -> None:
    kernel = next((h200_root / "triton" / "0").glob("*/triton_red_fused_sum_view_0.json")).parent
    shutil.copytree(kernel, tmp_path / kernel.name)
    fp = fingerprint_from_tree(tmp_path)
    assert (fp.triton_version, fp.python_version, fp.torch_version, fp.gpus) == ("3.6.0", "3.12", None, None)
    assert fp.env_scope == "none"


@pytest.mark.torch
def test_compare_h200_cache_with_this_torch(torch_version: str, h200_root: Path) -> None:
    cache_fp = fingerprint_from_tree(h200_root)
    env_fp = fingerprint_venv(VENV, env={"PATH": ""})
    found = {m.component: m for m in compare(cache_fp, env_fp)}
    assert found["torch"].message == (
        "built by torch 2.11.0+cu130 on NVIDIA H200; this environment has torch 2.13.0+cpu: Inductor will not use it"
    )
    assert (found["torch"].cached, found["torch"].current) == ("2.11.0+cu130", torch_version)
    assert found["gpu"].current is None and "NVIDIA H200" in found["gpu"].message
    assert found["triton"].cached == "3.6.0"
    assert found["python"].cached == "3.12"
    # Inductor's own cache/triton dirs are locations, not settings: never a mismatch.
    assert not any(c.startswith("env:") for c in found)
    assert compare(cache_fp, cache_fp) == [] and compare(env_fp, env_fp) == []


def test_compare_build_and_env_differences() -> None:
    base = Fingerprint(
        origin="venv", torch_version="2.11.0+cu130", torch_cuda="13.0", torch_git_version="a" * 40,
        torch_record="1" * 64, gpus=(GpuInfo(name="NVIDIA H200"),), python_version="3.12.3",
        env=(("TORCHINDUCTOR_MAX_AUTOTUNE", "1"), ("TRITON_CACHE_DIR", "/a")), env_scope="process",
    )  # fmt: skip

    def with_torch(fp: Fingerprint, **torch: str) -> Fingerprint:
        data = fp.to_dict()
        return Fingerprint.from_dict({**data, "torch": {**data["torch"], **torch}})

    [m] = compare(base, with_torch(base, record_blake3="2" * 64))
    assert m.component == "torch_build" and "RECORD" in m.message
    [m] = compare(base, with_torch(base, cuda="12.8"))
    assert m.component == "torch_build" and "CUDA/ROCm 13.0" in m.message
    # With Inductor's own key hash on both sides, it decides: RECORD also covers files Inductor ignores.
    keyed = with_torch(base, key_hash="k" * 51)
    assert compare(keyed, with_torch(keyed, record_blake3="2" * 64)) == []
    [m] = compare(keyed, with_torch(keyed, key_hash="e" * 51))
    assert m.component == "torch_build" and "edited" in m.message
    moved = Fingerprint.from_dict({**base.to_dict(), "env": {"TRITON_CACHE_DIR": "/b"}, "python": "3.12.7"})
    [m] = compare(base, moved)
    assert m.component == "env:TORCHINDUCTOR_MAX_AUTOTUNE" and m.current is None
    unknown = Fingerprint(origin="tree")
    assert compare(unknown, base) == [] and compare(base, unknown) == []


def test_fingerprint_from_dict_names_every_problem() -> None:
    with pytest.raises(CorruptError) as err:
        Fingerprint.from_dict({"format": 9, "origin": "x", "torch": {"version": 3}, "gpus": [{}], "env": {"A": 1}})
    text = str(err.value)
    for where in ("format", "origin", "torch.version", "gpus[0]", "env"):
        assert where in text


def test_compile_env_filter() -> None:
    env = {"TORCHINDUCTOR_X": "1", "TRITON_Y": "2", "MLIR_ENABLE_DUMP": "1", "TORCH_COMPILE_DEBUG": "1",
           "INDUCTOR_Z": "3", "PATH": "/bin", "TORCH_CUDA_ARCH_LIST": "9.0"}  # fmt: skip
    assert list(compile_env(env)) == [
        "INDUCTOR_Z", "MLIR_ENABLE_DUMP", "TORCHINDUCTOR_X", "TORCH_COMPILE_DEBUG", "TRITON_Y",
    ]  # fmt: skip


def test_cache_file_is_frozen() -> None:
    entry = CacheFile(path="a", size=1, mode=0o644, mtime_ns=0)
    with pytest.raises(AttributeError):
        entry.size = 2  # type: ignore[misc]

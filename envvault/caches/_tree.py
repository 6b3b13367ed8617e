"""Infer a fingerprint from a cache tree alone, reading its files as data (nothing is unpickled).

Where the facts are (checked on an Inductor root written by torch 2.11.0+cu130 / Triton 3.6.0):

- ``fxgraph/*/*/*`` entries are pickles (``CompiledFxGraph``) whose strings include the repro header
  torch writes (``torch/_dynamo/debug_utils.py``): ``os.environ['NAME'] = 'value'`` lines for every
  variable with TORCH, DYNAMO, INDUCTOR or TRITON in its name, ``# torch version: ...``,
  ``# torch cuda version: ...``, ``# torch git version: ...`` and ``# GPU Hardware Info:`` lines; and the
  cache-key debug lines (``FxGraphCachePickler.debug_lines``): ``[<hash>] torch_version: ...``, where
  the hash is ``fx_hash_of(torch_key())``, and ``system_info[device]: {'name': ...}``.
- ``aotautograd/*/*`` entries hold the same debug lines.
- Triton's kernel metadata ``<kernel hash>/<name>.json`` (under ``triton/<device>/`` in an Inductor root,
  at the top of a Triton cache) has ``triton_version``, ``target`` (backend, arch) and ``extern_libs``
  paths that name the venv's ``pythonX.Y``.
- Compiled helpers such as ``cuda_utils.cpython-312-x86_64-linux-gnu.so`` name the Python version too.

A root can hold entries of several environments (torch upgraded, cache kept): the newest entry wins and
the others are listed in ``notes``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .fingerprint import Fingerprint, GpuInfo, compile_env
from envvault.errors import CorruptError
from envvault.model.encoding import json_loads
from envvault.vault.fsutil import read_regular

__all__ = ["infer", "fingerprint_from_tree"]

_TORCH_VERSION = re.compile(rb"# torch version: ([^\s\\]+)")
_TORCH_CUDA = re.compile(rb"# torch cuda version: ([^\s\\]+)")
_TORCH_GIT = re.compile(rb"# torch git version: ([0-9a-f]+)")
_GPU_INFO = re.compile(rb"# GPU Hardware Info: ?\n((?:# [^\n]+ : \d+ ?\n)+)")
_KEY_HASH = re.compile(rb"\[([a-z2-7]{51})\] torch_version: ")
_DEVICE = re.compile(rb"system_info\[device\]: \{'name': '([^'\n]*)'\}")
_ENV_LINE = re.compile(rb"os\.environ\['([A-Za-z0-9_]+)'\] = '([^'\n]*)'")
_PY_TAG = re.compile(r"\.cpython-3(\d+)[a-z]*-")
_PY_PATH = re.compile(r"/python(3\.\d+)t?/")


def infer(root: Path) -> Fingerprint:
    """A ``tree`` fingerprint of ``root``; fields the tree does not reveal stay None."""
    notes: list[str] = []
    facts: dict[str, str | None] = {}
    env: dict[str, str] = {}
    seen_graph_info = False
    versions: set[str] = set()
    for path in _newest_last(_entries(root)):
        data = _read(path)
        if data is None:
            continue
        if m := _TORCH_VERSION.search(data):
            versions.add(m.group(1).decode())
            facts["torch_version"] = m.group(1).decode()
            cuda = _TORCH_CUDA.search(data)
            facts["torch_cuda"] = _none(cuda.group(1).decode()) if cuda else None
            git = _TORCH_GIT.search(data)
            facts["torch_git_version"] = git.group(1).decode() if git else None
            env.update({k.decode(): v.decode() for k, v in _ENV_LINE.findall(data)})
            seen_graph_info = True
            if g := _GPU_INFO.search(data):
                facts["gpu_from_header"] = g.group(1).decode()
        if m := _KEY_HASH.search(data):
            facts["torch_key_hash"] = m.group(1).decode()
        if m := _DEVICE.search(data):
            facts["gpu_name"] = m.group(1).decode()
    if len(versions) > 1:
        notes.append(f"entries from several torch versions: {', '.join(sorted(versions))}")
    triton_version, arch, python = _triton_facts(root, notes)
    python = python or _python_from_so(root)
    return Fingerprint(
        origin="tree",
        torch_version=facts.get("torch_version"),
        torch_git_version=facts.get("torch_git_version"),
        torch_cuda=facts.get("torch_cuda"),
        torch_key_hash=facts.get("torch_key_hash"),
        triton_version=triton_version,
        gpus=_gpus(facts, arch),
        python_version=python,
        env=tuple(compile_env(env).items()),
        env_scope="repro" if seen_graph_info else "none",
        notes=tuple(notes),
    )


def _entries(root: Path) -> list[Path]:
    found = []
    for pattern in ("fxgraph/*/*/*", "aotautograd/*/*"):
        found.extend(p for p in root.glob(pattern) if p.is_file() and not p.name.endswith(".tmp"))
    return found


def _newest_last(paths: list[Path]) -> list[Path]:
    def key(p: Path) -> tuple[int, str]:
        try:
            return p.stat().st_mtime_ns, str(p)
        except OSError:
            return 0, str(p)

    return sorted(paths, key=key)


_READ_LIMIT = 256 << 20  # a cache tree file read for its facts (a FIFO or a device there is never waited on)


def _read(path: Path) -> bytes | None:
    try:
        return read_regular(path, _READ_LIMIT, str(path), follow=True)
    except (OSError, CorruptError):
        return None


def _triton_facts(root: Path, notes: list[str]) -> tuple[str | None, str | None, str | None]:
    base = root / "triton"
    pattern = "*/*/*.json" if base.is_dir() else "*/*.json"
    found: dict[str, tuple[int, str, str | None, str | None]] = {}
    for path in (base if base.is_dir() else root).glob(pattern):
        if path.name.startswith("__grp__") or path.name.endswith(".tmp"):
            continue
        try:
            data = _read(path)
            if data is None:
                continue
            meta = json_loads(data.decode("utf-8"))
            mtime = path.stat().st_mtime_ns
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or not isinstance(meta.get("triton_version"), str):
            continue
        version = meta["triton_version"]
        target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
        arch = _arch(target.get("backend"), target.get("arch"))
        python = None
        for lib in meta.get("extern_libs") or []:
            if isinstance(lib, list) and len(lib) == 2 and isinstance(lib[1], str):
                if m := _PY_PATH.search(lib[1]):
                    python = m.group(1)
        previous = found.get(version)
        if previous is None or mtime > previous[0]:
            found[version] = (mtime, version, arch, python)
    if not found:
        return None, None, None
    if len(found) > 1:
        notes.append(f"kernels from several Triton versions: {', '.join(sorted(found))}")
    _, version, arch, python = max(found.values())
    return version, arch, python


def _arch(backend: object, arch: object) -> str | None:
    if backend == "cuda" and isinstance(arch, int):
        return f"{arch // 10}.{arch % 10}"  # Triton's 90 is compute capability 9.0
    return str(arch) if arch is not None else None


def _python_from_so(root: Path) -> str | None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".so") and (m := _PY_TAG.search(name)):
                return f"3.{m.group(1)}"
    return None


def _gpus(facts: dict[str, str | None], arch: str | None) -> tuple[GpuInfo, ...] | None:
    names: list[str] = []
    if facts.get("gpu_from_header"):
        for line in facts["gpu_from_header"].splitlines():
            name, _, count = line.lstrip("# ").rpartition(" : ")
            names.extend([name.strip()] * int(count or "1"))
    elif facts.get("gpu_name"):
        names.append(facts["gpu_name"])
    if not names:
        return None
    return tuple(GpuInfo(name=n, compute_cap=arch) for n in names)


def _none(text: str) -> str | None:
    return None if text == "None" else text


def fingerprint_from_tree(root: Path) -> Fingerprint:
    """What a cache tree says about the environment that wrote it (the sources are listed above)."""
    return infer(Path(root))

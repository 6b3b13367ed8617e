"""The fingerprints a cache snap records: the environment's (``environment_fingerprint``, memoised in the
stat cache so an unchanged environment costs a few ``stat`` calls) and the one kept with each cache
(``builder_fingerprint``: what the tree says about its builder, completed from the environment)."""

from __future__ import annotations

from envvault.model import records
import os
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Mapping

import blake3

from ..env.host import find_on_path
from ..errors import EnvironmentProblem, UsageError
from ..model.encoding import canonical_json
from ..vault.statcache import StatCache, stat_key

# fingerprint (and the venv readers) are imported when the environment changed: an unchanged one costs none.

__all__ = ["environment_fingerprint", "builder_fingerprint"]

_FP_FIELDS = ("torch_record", "torch_source_key", "triton_version", "triton_record", "gpus", "python_version")
_TORCH_FIELDS = ("torch_version", "torch_git_version", "torch_cuda", "torch_hip", "torch_key_hash")


def environment_fingerprint(venv: Path | None, statcache: StatCache | None = None,
                            env: Mapping[str, str] = os.environ) -> tuple[dict | None, str | None]:
    """``(fingerprint_venv(venv) with GPUs, as Fingerprint.to_dict(), None)``, or ``(None, why)`` when
    ``venv`` is None or unreadable.

    Kept in ``statcache`` while the venv's torch, Triton, interpreter, compile variables and GPUs are
    unchanged, so an unchanged environment costs a few ``stat`` calls, not RECORD parses and nvidia-smi.
    """
    if venv is None:
        return None, None
    parts = _fp_key(venv, env)
    key = None if parts is None else blake3.blake3(canonical_json(parts)).hexdigest()
    hit = statcache.extra.get("cache_env_fp") if statcache is not None else None
    if key is not None and isinstance(hit, dict) and hit.get("key") == key and isinstance(hit.get("fp"), dict):
        return hit["fp"], None
    from .fingerprint import fingerprint_venv, probe_gpus

    try:
        fp = fingerprint_venv(venv, env=env, probe_gpu=False)
    except (UsageError, EnvironmentProblem) as err:
        return None, f"no fingerprint of {venv}: {err}"
    fp = records.replace(fp, gpus=probe_gpus(env)).to_dict()
    if statcache is not None and key is not None:
        statcache.extra["cache_env_fp"] = {"key": key, "fp": fp}
        statcache.mark_dirty()
    return fp, None


def _fp_key(venv: Path, env: Mapping[str, str]) -> list | None:
    """What ``fingerprint_venv`` reads, as stats, plus the compile variables and the GPUs the driver sees."""
    parts: list[Any] = [str(venv)]
    try:
        sites = sorted(f"{venv}/lib/{d}/site-packages" for d in os.listdir(f"{venv}/lib") if d.startswith("python"))
    except OSError:
        sites = []
    for p in [f"{venv}/pyvenv.cfg"] + [f"{s}{rel}" for s in sites for rel in ("", "/torch/version.py",
                                                                                "/triton/__init__.py")]:
        try:
            parts.append(stat_key(os.stat(p)))
        except OSError:
            parts.append(None)
    # Every variable compile_env() could keep (a superset, so no import is needed to compute it).
    words = ("TORCH", "TRITON", "INDUCTOR", "LLVM", "MLIR", "MMA", "PTX", "AMDGCN", "TMEM", "DISABLE_", "USE_")
    parts.append(sorted((k, v) for k, v in env.items() if any(w in k for w in words)))
    if find_on_path("nvidia-smi", env.get("PATH", os.defpath)) is None:
        parts.append("no nvidia-smi")
    else:
        try:  # the GPUs the driver sees, without running nvidia-smi
            parts.append(sorted(os.listdir("/proc/driver/nvidia/gpus")))
            with open("/proc/driver/nvidia/version", "rb") as f:
                parts.append(f.readline().decode("ascii", "replace"))
        except OSError:
            return None
    return parts


def builder_fingerprint(tree, env_fp):
    """The fingerprint to keep with a cache: what the tree says about its builder, completed from the
    environment it was snapped in when the two agree on torch (a cache carried over from another torch
    keeps only what the tree says). Origin stays ``tree``: unknown fields never count as differences."""
    if env_fp is None:
        return tree
    if tree.torch_version is not None and env_fp.torch_version not in (None, tree.torch_version):
        return tree
    fill: dict[str, Any] = {}
    names = _FP_FIELDS + (() if tree.torch_version is not None else _TORCH_FIELDS)
    for name in names:
        if getattr(tree, name) is None and getattr(env_fp, name) is not None:
            fill[name] = getattr(env_fp, name)
    if tree.torch_version is not None and tree.torch_git_version is None and env_fp.torch_git_version:
        fill["torch_git_version"] = env_fp.torch_git_version
    if tree.env_scope == "none":
        fill.update(env=env_fp.env, env_scope=env_fp.env_scope)
    if not fill:
        return tree
    note = "completed from the environment at snap time: " + ", ".join(sorted(fill))
    return records.replace(tree, notes=tree.notes + (note,), **fill)

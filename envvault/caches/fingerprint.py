"""What a compile cache depends on, recorded with every archived cache and checked before a restore.

Inductor keys each entry by torch's version and a hash of torch's source files (``torch_key``), the
Triton build, ``torch.version.cuda``, the GPU name and its config; Triton keys kernels by its own build,
the target arch and a set of environment variables. When any of them differ, torch silently ignores
a restored cache. ``fingerprint_venv`` reads those facts from a venv's files through its environment reader
(torch is never imported), ``_tree.fingerprint_from_tree`` reads what a cache tree says about the
environment that wrote it, and ``compare`` names each difference in one line a person can act on. The
records (``Fingerprint``, ``GpuInfo``) live in ``envvault.model.cache``.
"""

from __future__ import annotations

import os
from envvault.model.records import dataclass
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Mapping

from ..model.cache import FINGERPRINT_FORMAT as FORMAT
from ..model.cache import Fingerprint, GpuInfo  # the records (re-exported here)
from ..terminate import OWN_SESSION

# The environment reader, the static readers of module files and RECORDs, torch's key and subprocess are
# imported where a venv is fingerprinted or a GPU asked: a restore that only compares two recorded
# fingerprints (or has no venv to compare with) starts without them.

__all__ = [
    "FORMAT",
    "GpuInfo",
    "Fingerprint",
    "Mismatch",
    "fingerprint_venv",
    "compare",
    "compile_env",
    "probe_gpus",
]

_PREFIXES = ("TORCHINDUCTOR_", "TRITON_", "TORCH_COMPILE_", "INDUCTOR_")
# Triton's CACHE_INVALIDATING_ENV_VARS (include/triton/Tools/Sys/GetEnv.hpp, Triton 3.x) without a
# TRITON_ prefix: they enter every kernel's cache key too.
_TRITON_KEY_VARS = frozenset(
    {
        "AMDGCN_ENABLE_DUMP", "AMDGCN_USE_BUFFER_ATOMICS", "AMDGCN_USE_BUFFER_OPS",
        "ALLOW_LHS_TMEM_LAYOUT_CONVERSION", "DISABLE_FAST_REDUCTION", "DISABLE_LLVM_OPT",
        "DISABLE_MMA_V3", "DISABLE_MMA_V5", "DISABLE_PTXAS_OPT", "ENABLE_LHS_TO_TMEM",
        "LLVM_ENABLE_TIMING", "LLVM_EXTRACT_DI_LOCAL_VARIABLES", "LLVM_IR_ENABLE_DUMP",
        "LLVM_PASS_PLUGIN_PATH", "MLIR_DISABLE_MULTITHREADING", "MLIR_DUMP_PATH", "MLIR_ENABLE_DIAGNOSTICS",
        "MLIR_ENABLE_DUMP", "MLIR_ENABLE_TIMING", "NVPTX_ENABLE_DUMP", "STORE_TMEM_TO_GLOBAL_BYPASS_SMEM",
        "USE_IR_LOC", "USE_TTGIR_LOC",
    }
)  # fmt: skip
# Where caches and dumps go: they never change a key (Inductor sets the first two itself while compiling).
_LOCATION_VARS = frozenset(
    {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR",
     "TORCH_COMPILE_DEBUG_DIR"}
)  # fmt: skip
# What torch's repro header records (torch/_dynamo/debug_utils.py, generate_env_vars_string).
_REPRO_WORDS = ("TORCH", "DYNAMO", "INDUCTOR", "TRITON")
_REPRO_SKIPPED = frozenset({"TRITON_LIBDEVICE_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH"})

@dataclass(frozen=True, slots=True, kw_only=True)
class Mismatch:
    """One component that differs between a cache and an environment, with a one-line explanation."""

    component: str
    cached: str | None
    current: str | None
    message: str


def compile_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that can change Inductor's or Triton's keys or behaviour
    (``TORCHINDUCTOR_*``, ``TRITON_*``, ``TORCH_COMPILE_*``, ``INDUCTOR_*`` and Triton's other
    key variables), sorted by name."""
    return {k: env[k] for k in sorted(env) if k.startswith(_PREFIXES) or k in _TRITON_KEY_VARS}


def probe_gpus(env: Mapping[str, str] = os.environ) -> tuple[GpuInfo, ...] | None:
    """NVIDIA GPUs from ``nvidia-smi``: empty when it is not on ``PATH`` (normal without a GPU), None
    when it is there but fails."""
    import subprocess

    from envvault.env.host import find_on_path

    exe = find_on_path("nvidia-smi", env.get("PATH", os.defpath))
    if exe is None:
        return ()
    for fields in ("name,compute_cap,driver_version", "name,driver_version"):
        try:
            done = subprocess.run(
                [exe, f"--query-gpu={fields}", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, env=dict(env), **OWN_SESSION,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode == 0:
            return tuple(_gpu_row(line, fields) for line in done.stdout.splitlines() if line.strip())
    return None


def fingerprint_venv(
    venv: Path, *, env: Mapping[str, str] = os.environ, exact: bool = False, probe_gpu: bool = True
) -> Fingerprint:
    """The fingerprint of ``venv`` for a process started with ``env``, read from its files.

    Reads ``torch/version.py``, the RECORDs of torch and Triton, ``triton/__init__.py`` and
    ``pyvenv.cfg``; asks ``nvidia-smi`` unless ``probe_gpu`` is false (then ``gpus`` is None). With
    ``exact``, also hashes torch's module files as Inductor's ``torch_key`` does (about a second), which
    catches files edited in place. Raises ``UsageError`` when ``venv`` is not a venv.
    """
    from ..env.reader import reader_for
    from ..env.static import find_dist_info, module_constants, record_digest
    from . import _torchkey

    reader = reader_for(Path(venv))
    site = reader.site_packages()
    python = reader.python_version()
    values: dict[str, Any] = {}
    torch_dir = site / "torch"
    if (torch_dir / "version.py").is_file():
        v = module_constants(torch_dir / "version.py", {"__version__", "git_version", "cuda", "hip"})
        values.update(
            torch_version=_str(v.get("__version__")),
            torch_git_version=_str(v.get("git_version")),
            torch_cuda=_str(v.get("cuda")),
            torch_hip=_str(v.get("hip")),
        )
        info = find_dist_info(site, "torch")
        values["torch_record"] = record_digest(info) if info else None
        if exact and values["torch_version"]:
            key = _torchkey.torch_source_key(
                torch_dir, values["torch_version"], _torchkey.extension_suffixes(torch_dir, python)
            )
            values.update(torch_source_key=key.hex(), torch_key_hash=_torchkey.fx_hash_of(key))
    triton_init = site / "triton" / "__init__.py"
    if triton_init.is_file():
        values["triton_version"] = _str(module_constants(triton_init, {"__version__"}).get("__version__"))
        info = find_dist_info(site, "triton")
        values["triton_record"] = record_digest(info) if info else None
    return Fingerprint(
        origin="venv",
        gpus=probe_gpus(env) if probe_gpu else None,
        python_version=python,
        env=tuple(compile_env(env).items()),
        env_scope="process",
        **values,
    )


def compare(cache_fp: Fingerprint, env_fp: Fingerprint) -> list[Mismatch]:
    """Every component where ``cache_fp`` (who built the cache) and ``env_fp`` (who would use it) differ.

    At most one mismatch per component, in this order: torch (version), torch_build (same version, other
    build, CUDA/ROCm or edited files), triton, gpu, python; then one per compile variable
    (``env:<NAME>``). Unknown values never count as differences. Empty when nothing known differs.
    """
    found = [
        _torch_mismatch(cache_fp, env_fp),
        _triton_mismatch(cache_fp, env_fp),
        _gpu_mismatch(cache_fp, env_fp),
        _python_mismatch(cache_fp, env_fp),
    ]
    return [m for m in found if m is not None] + _env_mismatches(cache_fp, env_fp)


def _torch_mismatch(cache_fp: Fingerprint, env_fp: Fingerprint) -> Mismatch | None:
    c, e = cache_fp.torch_version, env_fp.torch_version
    built_by = _torch_on(cache_fp)
    if _both_known(cache_fp, env_fp, c, e) and c != e:
        return Mismatch(
            component="torch", cached=c, current=e,
            message=f"built by {built_by}; this environment has {_torch_on(env_fp)}: Inductor will not use it",
        )  # fmt: skip
    if c is None or c != e:
        return None
    why = _build_difference(cache_fp, env_fp)
    if why is None:
        return None
    return Mismatch(component="torch_build", cached=why[0], current=why[1],
                    message=f"built by {built_by} {why[2]}: Inductor will not use it")  # fmt: skip


def _build_difference(cache_fp: Fingerprint, env_fp: Fingerprint) -> tuple[str | None, str | None, str] | None:
    """(cached, current, phrase) for the build detail that differs between two equal torch versions."""
    for c, e in ((cache_fp.torch_cuda, env_fp.torch_cuda), (cache_fp.torch_hip, env_fp.torch_hip)):
        # Known whenever the version is; None means a build without it.
        if c != e:
            return c, e, f"for {_label('CUDA/ROCm', c)}; this one is for {_label('CUDA/ROCm', e)}"
    c, e = cache_fp.torch_key_hash, env_fp.torch_key_hash
    if c is not None and e is not None:
        # Inductor's own key over torch's module files decides; RECORD also covers files it ignores.
        if c == e:
            return None
        return c, e, f"whose module files hash to {c[:12]}; this environment's torch hashes to {e[:12]} (edited?)"
    checks = [
        (cache_fp.torch_git_version, env_fp.torch_git_version, "from git {c}; this one is from git {e}"),
        (cache_fp.torch_record, env_fp.torch_record, "with other files (RECORD digest {c}; here {e})"),
    ]
    for c, e, phrase in checks:
        if c is not None and e is not None and c != e:
            return c, e, phrase.format(c=c[:12], e=e[:12])
    return None


def _triton_mismatch(cache_fp: Fingerprint, env_fp: Fingerprint) -> Mismatch | None:
    c, e = cache_fp.triton_version, env_fp.triton_version
    if _both_known(cache_fp, env_fp, c, e) and c != e:
        effect = "its kernels cannot be used" if e is None else "Triton will recompile every kernel"
        return Mismatch(
            component="triton", cached=c, current=e,
            message=f"kernels built with {_label('Triton', c)}; this environment has {_label('Triton', e)}: {effect}",
        )  # fmt: skip
    c_rec, e_rec = cache_fp.triton_record, env_fp.triton_record
    if c is not None and c == e and c_rec is not None and e_rec is not None and c_rec != e_rec:
        return Mismatch(
            component="triton", cached=c_rec, current=e_rec,
            message=f"kernels built with another build of Triton {c} (its files differ): Triton will recompile them",
        )  # fmt: skip
    return None


def _gpu_mismatch(cache_fp: Fingerprint, env_fp: Fingerprint) -> Mismatch | None:
    if cache_fp.gpus is None or env_fp.gpus is None:
        return None
    c, e = _gpu_names(cache_fp.gpus), _gpu_names(env_fp.gpus)
    if not c or c == e:
        return None
    return Mismatch(
        component="gpu", cached=c, current=e or None,
        message=f"built on {c}; this environment has {e or 'no NVIDIA GPU'}: "
        "the GPU name is part of Inductor's key, so it will not use it",
    )  # fmt: skip


def _python_mismatch(cache_fp: Fingerprint, env_fp: Fingerprint) -> Mismatch | None:
    c, e = _major_minor(cache_fp.python_version), _major_minor(env_fp.python_version)
    if not c or not e or c == e:
        return None
    return Mismatch(
        component="python", cached=c, current=e,
        message=f"built under Python {c}; this environment has Python {e}: torch's key covers its "
        "compiled _C module and the cached .so files are per Python, so it will not be used",
    )  # fmt: skip


def _env_mismatches(cache_fp: Fingerprint, env_fp: Fingerprint) -> list[Mismatch]:
    if "none" in (cache_fp.env_scope, env_fp.env_scope):
        return []
    cached, current = dict(cache_fp.env), dict(env_fp.env)
    found = []
    for name in sorted(set(cached) | set(current)):
        if name in _LOCATION_VARS or not (_sees(cache_fp, name) and _sees(env_fp, name)):
            continue
        c, e = cached.get(name), current.get(name)
        if c != e:
            was = f"was {c!r}" if c is not None else "was unset"
            now = f"it is {e!r}" if e is not None else "it is unset"
            found.append(Mismatch(
                component=f"env:{name}", cached=c, current=e,
                message=f"{name} {was} when the cache was built; here {now}: Inductor and Triton "
                "read such settings into their keys, so entries may be missed",
            ))  # fmt: skip
    return found


def _sees(fp: Fingerprint, name: str) -> bool:
    if not (name.startswith(_PREFIXES) or name in _TRITON_KEY_VARS):
        return False
    if fp.env_scope == "repro":
        return any(w in name for w in _REPRO_WORDS) and name not in _REPRO_SKIPPED
    return fp.env_scope == "process"


def _both_known(cache_fp: Fingerprint, env_fp: Fingerprint, c: str | None, e: str | None) -> bool:
    # In a venv fingerprint None means "not installed", a fact; in a tree's it means "cannot tell".
    return (c is not None or cache_fp.origin == "venv") and (e is not None or env_fp.origin == "venv") and (
        c is not None or e is not None
    )


def _torch_on(fp: Fingerprint) -> str:
    text = _label("torch", fp.torch_version)
    names = _gpu_names(fp.gpus or ())
    return f"{text} on {names}" if names else text


def _label(what: str, version: str | None) -> str:
    return f"{what} {version}" if version else f"no {what}"


def _gpu_names(gpus: tuple[GpuInfo, ...]) -> str:
    return ", ".join(sorted({g.name for g in gpus}))


def _major_minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _gpu_row(line: str, fields: str) -> GpuInfo:
    cells = [c.strip() for c in line.split(",")]
    row = dict(zip(fields.split(","), cells))
    return GpuInfo(name=row.get("name", ""), compute_cap=row.get("compute_cap"), driver=row.get("driver_version"))

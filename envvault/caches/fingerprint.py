"""What a compile cache depends on, recorded with every archived cache and checked before a restore.

Inductor keys each entry by torch's version and a hash of torch's source files (``torch_key``), the
Triton build, ``torch.version.cuda``, the GPU name and its config; Triton keys kernels by its own build,
the target arch and a set of environment variables. When any of them differ, torch silently ignores
a restored cache. ``fingerprint_venv`` reads those facts from a venv's files (torch is never imported),
``_tree.fingerprint_from_tree`` reads what a cache tree says about the environment that wrote it, and
``compare`` names each difference in one line a person can act on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from ..errors import CorruptError
from ..env.static import find_dist_info, module_constants, record_digest
from ..env.reader import reader_for
from . import _torchkey

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

FORMAT = 1

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

EnvScope = Literal["process", "repro", "none"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """One GPU: its name as torch reports it, compute capability (``"9.0"``) and driver, when known."""

    name: str
    compute_cap: str | None = None
    driver: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fingerprint:
    """The environment a cache was built in (or would be used in).

    None means unknown, except in a fingerprint of a venv (``origin == "venv"``), where ``torch_version``
    or ``triton_version`` None means not installed. ``torch_cuda`` / ``torch_hip`` are known exactly when
    ``torch_version`` is (None then means a build without CUDA / ROCm). ``gpus`` is None when unknown and
    empty when none was found. ``env`` holds the compile-related variables (see ``compile_env``);
    ``env_scope`` says which of them the source could see: all (``process``), only those torch's repro
    header records (``repro``) or none.
    """

    origin: Literal["venv", "tree"]
    torch_version: str | None = None
    torch_git_version: str | None = None
    torch_cuda: str | None = None
    torch_hip: str | None = None
    torch_record: str | None = None
    torch_source_key: str | None = None
    torch_key_hash: str | None = None
    triton_version: str | None = None
    triton_record: str | None = None
    gpus: tuple[GpuInfo, ...] | None = None
    python_version: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    env_scope: EnvScope = "none"
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``format`` 1); ``from_dict`` reads it back."""
        return {
            "format": FORMAT,
            "origin": self.origin,
            "torch": {
                "version": self.torch_version,
                "git_version": self.torch_git_version,
                "cuda": self.torch_cuda,
                "hip": self.torch_hip,
                "record_blake3": self.torch_record,
                "source_key": self.torch_source_key,
                "key_hash": self.torch_key_hash,
            },
            "triton": {"version": self.triton_version, "record_blake3": self.triton_record},
            "gpus": None
            if self.gpus is None
            else [{"name": g.name, "compute_cap": g.compute_cap, "driver": g.driver} for g in self.gpus],
            "python": self.python_version,
            "env": dict(self.env),
            "env_scope": self.env_scope,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        """Parse ``to_dict`` output; raises ``CorruptError`` naming every bad field."""
        problems: list[str] = []
        if not isinstance(data, Mapping):
            raise CorruptError("fingerprint: not a JSON object")
        if data.get("format") != FORMAT:
            problems.append(f"format: expected {FORMAT}, got {data.get('format')!r}")
        origin = data.get("origin")
        if origin not in ("venv", "tree"):
            problems.append(f"origin: expected 'venv' or 'tree', got {origin!r}")
        torch = _section(data, "torch", problems)
        triton = _section(data, "triton", problems)
        text = {
            f"torch.{k}": torch.get(k)
            for k in ("version", "git_version", "cuda", "hip", "record_blake3", "source_key", "key_hash")
        }
        text.update({f"triton.{k}": triton.get(k) for k in ("version", "record_blake3")})
        text["python"] = data.get("python")
        for where, value in text.items():
            if value is not None and not isinstance(value, str):
                problems.append(f"{where}: expected a string or null")
        gpus = _parse_gpus(data.get("gpus"), problems)
        env = data.get("env", {})
        if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
            problems.append("env: expected an object of strings")
            env = {}
        scope = data.get("env_scope", "none")
        if scope not in ("process", "repro", "none"):
            problems.append(f"env_scope: unknown {scope!r}")
        notes = data.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            problems.append("notes: expected a list of strings")
            notes = []
        if problems:
            raise CorruptError("fingerprint: " + "; ".join(problems))
        return cls(
            origin=origin,
            torch_version=text["torch.version"],
            torch_git_version=text["torch.git_version"],
            torch_cuda=text["torch.cuda"],
            torch_hip=text["torch.hip"],
            torch_record=text["torch.record_blake3"],
            torch_source_key=text["torch.source_key"],
            torch_key_hash=text["torch.key_hash"],
            triton_version=text["triton.version"],
            triton_record=text["triton.record_blake3"],
            gpus=gpus,
            python_version=text["python"],
            env=tuple(sorted(env.items())),
            env_scope=scope,
            notes=tuple(notes),
        )


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
    exe = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if exe is None:
        return ()
    for fields in ("name,compute_cap,driver_version", "name,driver_version"):
        try:
            done = subprocess.run(
                [exe, f"--query-gpu={fields}", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, env=dict(env),
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


def _section(data: Mapping[str, Any], key: str, problems: list[str]) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        problems.append(f"{key}: expected an object")
        return {}
    return value


def _parse_gpus(value: Any, problems: list[str]) -> tuple[GpuInfo, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        problems.append("gpus: expected a list or null")
        return None
    gpus = []
    for i, g in enumerate(value):
        if not isinstance(g, Mapping) or not isinstance(g.get("name"), str):
            problems.append(f"gpus[{i}]: expected an object with a string name")
            continue
        cap, driver = g.get("compute_cap"), g.get("driver")
        if not all(v is None or isinstance(v, str) for v in (cap, driver)):
            problems.append(f"gpus[{i}]: compute_cap and driver must be strings or null")
            continue
        gpus.append(GpuInfo(name=g["name"], compute_cap=cap, driver=driver))
    return tuple(gpus)

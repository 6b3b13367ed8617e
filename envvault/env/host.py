"""Host facts that decide whether a GPU environment works, and the environment variables that change behaviour."""

from __future__ import annotations

import os
import re

from envvault.terminate import OWN_SESSION

TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Mapping

__all__ = ["host_facts", "find_on_path", "relevant_env", "redact"]

_ENV_EXACT = {"CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD",
              "CUDA_CACHE_PATH", "HF_HOME", "OMP_NUM_THREADS", "PYTHONHASHSEED", "TMPDIR"}
_ENV_PREFIXES = ("TORCH", "TRITON", "NCCL", "INDUCTOR", "PYTORCH", "CUBLAS", "CUDNN", "XLA_", "JAX_")
_INDEX_VARS = re.compile(r"^(PIP_(INDEX_URL|EXTRA_INDEX_URL|FIND_LINKS|TRUSTED_HOST|CONSTRAINT|NO_INDEX|PRE)"
                         r"|UV_(INDEX|INDEX_URL|DEFAULT_INDEX|EXTRA_INDEX_URL|FIND_LINKS|INDEX_STRATEGY|PRERELEASE|TORCH_BACKEND|NO_INDEX|OFFLINE))$")
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|CREDENTIAL)", re.I)
_URL_CRED = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^/@\s]+)@")


def redact(value: str) -> str:
    """Hide credentials in URLs: ``https://user:tok@host`` -> ``https://***@host``."""
    return _URL_CRED.sub(lambda m: m.group("scheme") + "***@", value)


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    out = {}
    for key, value in environ.items():
        if key in _ENV_EXACT or key.startswith(_ENV_PREFIXES) or _INDEX_VARS.match(key):
            out[key] = "***" if _SECRET_NAME.search(key) else redact(value)
    return dict(sorted(out.items()))


def _glibc() -> str | None:
    lib, ver = os.confstr("CS_GNU_LIBC_VERSION").split() if _has_confstr() else ("", "")
    lib = "glibc" if lib == "glibc" else lib
    return ver if lib == "glibc" and ver else None


def _has_confstr() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError, AttributeError):
        return False


def find_on_path(name: str, path: str | None = None) -> str | None:
    """Where ``name`` is on ``path`` (default ``$PATH``): an executable that is not a folder, in the first
    folder that holds one, as ``shutil.which`` finds it, except that an empty entry is skipped: it would
    mean the working directory, and a snap run there (the shell hook runs in every directory) must not run
    an ``nvidia-smi`` someone left in it. Made without importing shutil (with bz2 and lzma, 2 ms of an
    unchanged snap's start on a host without nvidia-smi). The one PATH search of the snap's host facts and
    of the compile caches' fingerprints."""
    for folder in (os.environ.get("PATH", os.defpath) if path is None else path).split(os.pathsep):
        if folder:
            candidate = os.path.join(folder, name)
            if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
                return candidate
    return None


def _nvidia() -> dict:
    exe = find_on_path("nvidia-smi")
    if not exe:
        return {}
    import subprocess  # only where there is an nvidia-smi to run
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, **OWN_SESSION,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {"nvidia_smi": "failed"}
    if out.returncode != 0:
        return {"nvidia_smi": "failed"}
    gpus, driver = [], None
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"name": parts[0], "compute_cap": parts[1], "memory": parts[3] if len(parts) > 3 else None})
            driver = parts[2]
    return {"gpus": gpus, "driver": driver}


def _gpu_key() -> list | None:
    """What nvidia-smi's answer depends on, read from files: the boot, the loaded driver's version line and
    the GPUs it drives (their PCI addresses). None without a loaded NVIDIA driver (nothing to remember)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read(64).decode("ascii", "replace").strip()
        with open("/proc/driver/nvidia/version", "rb") as f:
            version = f.read(4096).decode("utf-8", "replace")
        gpus = sorted(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return None
    return [boot, version, gpus]


def host_facts(memo: dict | None = None) -> dict:
    """The host's facts. ``memo`` (a stat cache's ``extra``) keeps nvidia-smi's answer (GPU names, memory,
    driver) while the boot, the loaded driver and its GPUs stay the same: nvidia-smi takes a good part of a
    second on some GPU hosts, and a second snap should not pay it."""
    u = os.uname()
    facts = {
        "os": f"{u.sysname}-{u.release}",
        "arch": u.machine,
        "glibc": _glibc(),
        "hostname": u.nodename,
        "cpus": os.cpu_count(),
        "gpus": [],
        "driver": None,
    }
    key = _gpu_key() if memo is not None else None
    hit = memo.get("nvidia") if key is not None else None
    if isinstance(hit, dict) and hit.get("key") == key and isinstance(hit.get("value"), dict):
        facts.update(hit["value"])
        return facts
    gpu = _nvidia()
    if key is not None and gpu and "nvidia_smi" not in gpu:
        memo["nvidia"] = {"key": key, "value": gpu}
    facts.update(gpu)
    return facts


def host_facts_cached(cache) -> dict:
    """The host's facts, nvidia-smi's answer remembered in ``cache`` (a stat cache: its ``extra`` is the
    memo of ``host_facts``; ``mark_dirty()`` when the memo changed, so that it is saved)."""
    before = cache.extra.get("nvidia")
    facts = host_facts(cache.extra)
    if cache.extra.get("nvidia") is not before:
        cache.mark_dirty()
    return facts

"""Which cache roots a snap archives: the discovered ones (torch's, Triton's, CUDA's) and the configured
ones, each once, a root inside another left to the outer one."""

from __future__ import annotations

import os
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Mapping, Sequence

from envvault.model.paths import absolute_path

from .discover import CacheLocation, discover_caches, inductor_cache_dir, user_dirs

__all__ = ["locations_to_snap"]


def locations_to_snap(
    env: Mapping[str, str] = os.environ,
    extra: Sequence[Path] = (),
    *,
    discover: bool = True,
    use_torch_python: Path | None = None,
    kinds: frozenset[str] | None = None,
    named: Sequence[Path] = (),
) -> list[CacheLocation]:
    """The existing cache roots to archive: torch's, Triton's, CUDA's and ``extra`` (unless ``discover``
    is false: then ``extra`` only), only those of ``kinds`` when given. A root inside another one is left
    to the outer one.

    With ``TORCHINDUCTOR_CACHE_DIR`` set, Inductor still keeps precompiled C++ headers under its default
    root (``codecache._HEADER_DIR`` is ``default_cache_dir()/precompiled_headers``), so that folder is a
    root of its own: without it a warm CPU compile rebuilds a 150 MB header.
    """
    if discover:
        found = discover_caches(env, extra, use_torch_python=use_torch_python, named=named)
        if "TORCHINDUCTOR_CACHE_DIR" in env:
            default, _ = inductor_cache_dir({k: v for k, v in env.items() if k != "TORCHINDUCTOR_CACHE_DIR"})
            pch = default / "precompiled_headers"
            found.append(CacheLocation(kind="inductor", path=pch, exists=pch.is_dir(),
                                       reason="Inductor's precompiled headers (kept under the default root)"))
    else:
        found = []
        for path, reason in user_dirs(extra, named):
            if all(loc.path != path for loc in found):
                found.append(CacheLocation(kind="user", path=path, exists=path.is_dir(), reason=reason))
    # A folder named by the caller (--cache-dir, the configured ones) is always taken, whatever kind it is
    # found as (an Inductor root named by TORCHINDUCTOR_CACHE_DIR and --cache-dir is listed once, as Inductor's).
    given = {absolute_path(p) for p in extra}
    roots = [loc for loc in found
             if loc.exists and (kinds is None or loc.kind in kinds or loc.path in given)]
    real = {loc.path: os.path.realpath(loc.path) for loc in roots}
    kept: list[CacheLocation] = []
    for loc in roots:
        inside = [o for o in roots if o is not loc and _within(real[loc.path], real[o.path])]
        if any(real[o.path] != real[loc.path] for o in inside):
            continue  # nested in another root
        if any(real[o.path] == real[loc.path] for o in kept):
            continue  # the same folder under two names
        kept.append(loc)
    return kept


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")

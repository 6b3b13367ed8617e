"""What a person calls an entry of a cache (an FX graph, an AOT autograd entry, a Triton kernel folder),
and the counts by category a snapshot lists for each archived cache."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Sequence

__all__ = ["entry_key", "summarise_entries"]


def entry_key(kind: str, path: str) -> str:
    """The logical cache entry a file belongs to: an FX graph, an AOT autograd entry, a Triton kernel
    folder, or the file itself (generated kernels and ``.so`` files in two-letter folders)."""
    parts = path.split("/")
    if parts[0] == "fxgraph" and len(parts) >= 4:
        return "/".join(parts[:3])
    if parts[0] == "aotautograd" and len(parts) >= 3:
        return "/".join(parts[:2])
    if parts[0] == "triton" and len(parts) >= 4:
        return "/".join(parts[:3])
    if kind == "triton" and len(parts) >= 2:
        return parts[0]
    return path


def summarise_entries(kind: str, paths: Sequence[str]) -> dict[str, int]:
    """Entry counts by category (``fxgraph``, ``aotautograd``, ``triton``, ``kernels``, ``other``...)."""
    keys = {entry_key(kind, p) for p in paths}
    out: dict[str, int] = {}
    for k in keys:
        head = k.split("/", 1)[0]
        if kind == "triton":
            cat = "triton"
        elif head in ("fxgraph", "aotautograd", "triton", "precompiled_headers"):
            cat = head
        elif len(head) == 2 and "/" in k:
            cat = "kernels"
        elif k.endswith((".gch", ".h")) and kind == "inductor":
            cat = "precompiled_headers"
        else:
            cat = "other"
        out[cat] = out.get(cat, 0) + 1
    return dict(sorted(out.items()))

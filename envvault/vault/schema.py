"""The shape of a snapshot document: moved to ``envvault.model.snapshot`` (``parse_snapshot``, typed records).
Kept as the names the vault imports."""

from __future__ import annotations

from envvault.model.snapshot import is_id, snapshot_problems, tag_name_problem

__all__ = ["snapshot_problems", "is_id", "tag_name_problem"]

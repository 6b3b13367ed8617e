"""A ``diff.DiffResult`` as lines for people (the renderer; ``diff`` computes, this writes text)."""

from __future__ import annotations

from envvault.diff import DiffResult, PackageChange, build_facts
from envvault.output import printable, style

__all__ = ["render_text"]

_LIST_LIMIT = 8  # files listed per package in text; JSON lists them all


def _build_words(c: PackageChange) -> str:
    facts = build_facts(c.old_build_info, c.new_build_info)
    words = []
    keys = ("cuda", "hip", "git_version", "version", "debug") if c.kind == "build" else ("cuda", "hip", "git_version")
    for key in keys:
        if key in facts:
            o, n = facts[key]
            if key == "git_version":
                o, n = (o or "none")[:7], (n or "none")[:7]
                key = "git"
            words.append(f"{key} {o} -> {n}")
    if not words and c.build_changed:
        words.append(f"build {(c.old_build_id or '?')[:12]} -> {(c.new_build_id or '?')[:12]}")
    return ", ".join(words)


def _files_line(label: str, files: tuple[str, ...], colour: bool, tint: str) -> list[str]:
    shown = list(files[:_LIST_LIMIT])
    more = len(files) - len(shown)
    lines = [f"    {style(label, tint, colour)} {printable(f)}" for f in shown]  # (a name may hold a newline)
    if more:
        lines.append(f"    ... and {more} more (--json lists all)")
    return lines


def render_text(result: DiffResult, *, colour: bool | None = None) -> str:
    """Lines for people, in the order: interpreter, added/removed, versions, builds, edits, host, env. Every
    text a snapshot carries goes through ``printable``: a snapshot may be anyone's."""
    lines: list[str] = []
    c = colour

    def row(word: str, tint: str, text: str) -> None:
        lines.append(style(f"{word:<10}", tint, c) + printable(text))

    for k, (o, n) in result.python.items():
        row("python", "magenta", f"{k} {o} -> {n}")
    for p in result.added:
        row("added", "green", f"{p.name} {p.version}")
    for p in result.removed:
        row("removed", "red", f"{p.name} {p.version}")
    for ch in result.changed:
        if ch.kind in ("upgrade", "downgrade", "local"):
            note = " (local label)" if ch.kind == "local" else ""
            facts = _build_words(ch) if ch.kind == "local" else ""
            row(ch.kind if ch.kind != "local" else "version", "yellow",
                f"{ch.name} {ch.old_version} -> {ch.new_version}{note}" + (f": {facts}" if facts else ""))
    for ch in result.changed:
        if ch.kind == "build":
            row("build", "red", f"{ch.name} {ch.new_version}: {_build_words(ch)}")
    for ch in result.changed:
        if ch.modified_files or ch.missing_files or ch.put_back_files:
            counts = [f"{len(ch.modified_files)} file(s) differ"] if ch.modified_files else []
            counts += [f"{len(ch.missing_files)} deleted"] if ch.missing_files else []
            counts += [f"{len(ch.put_back_files)} put back"] if ch.put_back_files else []
            row("edited", "red", f"{ch.name} {ch.new_version}: " + ", ".join(counts))
            lines.extend(_files_line("~", ch.modified_files, c, "red"))
            lines.extend(_files_line("-", ch.missing_files, c, "red"))
            lines.extend(_files_line("+", ch.put_back_files, c, "red"))
        elif ch.kind == "edited" and not ch.mode_files:  # the state ids differ, no file named (pdm's links
            # into a cache: RECORD gives no hash, the files' bytes are in the state id only)
            row("edited", "red", f"{ch.name} {ch.new_version}: its files' bytes differ (which: `envvault diff` of "
                "two snapshots names them)")
    for ch in result.changed:
        if ch.mode_files:
            row("mode", "yellow", f"{ch.name} {ch.new_version}: {len(ch.mode_files)} file(s) gained or lost the "
                "execute bit")
            lines.extend(_files_line("x", ch.mode_files, c, "yellow"))
    for k, (o, n) in result.host.items():
        row("host", "cyan", f"{k} {o} -> {n}")
    env = result.env
    for k, v in (env.get("added") or {}).items():
        row("env", "cyan", f"+{k}={v}")
    for k, v in (env.get("removed") or {}).items():
        row("env", "cyan", f"-{k}={v}")
    for k, (o, n) in (env.get("changed") or {}).items():
        row("env", "cyan", f"{k}: {o} -> {n}")
    return "\n".join(lines)

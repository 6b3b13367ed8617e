"""The git work tree a stamping process runs in: root, commit, branch and dirty flag, read without running
anything the repository configures (docs/format.md, "Threat model").

The repository may be one the user owns but did not write (an unpacked archive) and the start folder any
folder a training process runs in: commit and branch come from ``.git`` files (bounded reads of regular
files, refs checked for shape), and ``git status`` runs only under a plain configuration, with everything that
could run repository code switched off.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Iterator

from envvault.errors import EnvvaultError
from envvault.model.stamp import GitState
from envvault.torch.files import read_small

__all__ = ["git_state"]

_GIT_TIMEOUT = 2.0


def git_state(start: Path) -> GitState | None:
    """Commit, branch and dirty flag of the git work tree holding ``start``, or None outside one.

    Nothing a repository configures runs: the commit and branch are read from ``.git`` files (HEAD, refs,
    packed-refs; bounded reads of regular files, refs checked for shape). Only the dirty flag runs
    ``git status`` (tracked files only), and only when the repository's config holds nothing but plain
    settings (:func:`_plain_config`), with fsmonitor, the untracked cache, hooks, system config, optional
    locks, submodules and lazy fetches off; None otherwise, or when git is missing or slow. The repository
    may be one the user owns but did not write (an unpacked archive) and ``start`` any folder a training
    process runs in.
    """
    root = next((d for d in (start, *start.parents) if (d / ".git").exists()), None)
    if root is None:
        return None
    unknown = GitState(str(root), None, None, None)
    gitdir = root / ".git"
    if gitdir.is_file():  # a worktree or submodule: "gitdir: <path>"
        text = _git_text(gitdir)
        if text is None or not text.startswith("gitdir:"):
            return unknown
        gitdir = (root / text[len("gitdir:"):].strip()).resolve()
    common = gitdir
    text = _git_text(gitdir / "commondir")
    if text is not None:
        common = (gitdir / text.strip()).resolve()
    head = _git_text(gitdir / "HEAD")
    if head is None:
        return unknown
    head = head.strip()
    branch, commit = None, _object_id(head)
    if head.startswith("ref:"):
        ref = head[4:].strip()
        if not _ref_name(ref):
            return unknown
        branch = ref.removeprefix("refs/heads/")
        commit = _read_ref(gitdir, common, ref)
    dirty = _git_dirty(root) if _plain_config(gitdir, common) else None
    return GitState(str(root), commit, branch, dirty)


_GIT_SMALL = 1 << 16  # HEAD, a loose ref, a gitdir or commondir file
_GIT_LARGE = 16 << 20  # packed-refs, config


def _git_text(path: Path, limit: int = _GIT_SMALL) -> str | None:
    """The text of a regular file of at most ``limit`` bytes; None for anything else (missing, a FIFO,
    a device, too large, unreadable)."""
    try:
        raw = read_small(path, limit)
    except (OSError, EnvvaultError):
        return None
    return None if raw is None else raw.decode("utf-8", "replace")


def _object_id(text: str) -> str | None:
    text = text.strip()
    return text if len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text) else None


def _ref_name(ref: str) -> bool:
    parts = ref.split("/")
    return (ref.startswith("refs/") and len(ref) < 1024 and all(p not in ("", ".", "..") for p in parts)
            and not any(c < " " or c == "\x7f" for c in ref))


def _read_ref(gitdir: Path, common: Path, ref: str) -> str | None:
    for base in (gitdir, common):
        text = _git_text(base / ref)
        if text is not None:
            return _object_id(text)
    text = _git_text(common / "packed-refs", _GIT_LARGE)
    for line in (text or "").splitlines():
        sha, _, name = line.partition(" ")
        if name.strip() == ref:
            return _object_id(sha)
    return None  # a branch without commits yet


# The repository settings under which `git status` runs nothing the repository names: section -> keys.
# Anything else (core.fsmonitor, core.hooksPath, filter.*, include.*, remote.*.uploadpack, a promisor
# remote...) or a config envvault cannot parse leaves `dirty` null.
_PLAIN_CONFIG = {
    "core": {"repositoryformatversion", "filemode", "bare", "logallrefupdates", "ignorecase", "precomposeunicode",
             "symlinks", "autocrlf", "eol", "safecrlf", "quotepath", "checkstat", "trustctime", "abbrev",
             "compression", "loosecompression", "bigfilethreshold", "sparsecheckout", "sparsecheckoutcone",
             "preloadindex", "warnambiguousrefs", "whitespace", "commentchar"},
    "remote": {"url", "pushurl", "fetch", "push", "tagopt", "prune", "mirror", "skipdefaultupdate"},
    "branch": {"remote", "merge", "rebase", "pushremote", "description"},
    "user": {"name", "email"},
    "init": {"defaultbranch"},
    "pull": {"rebase", "ff"},
    "push": {"default", "autosetupremote"},
    "fetch": {"prune"},
    "gc": {"auto"},
    "index": {"version"},
    "extensions": {"objectformat", "worktreeconfig"},
    "submodule": {"url", "active", "path", "branch"},
}


def _plain_config(gitdir: Path, common: Path) -> bool:
    """True when every setting in the repository's config files is in :data:`_PLAIN_CONFIG`."""
    for path in {common / "config", gitdir / "config", common / "config.worktree", gitdir / "config.worktree"}:
        if not os.path.lexists(path):
            continue
        text = _git_text(path, _GIT_LARGE)
        if text is None:
            return False
        try:
            if any(key not in _PLAIN_CONFIG.get(section, ()) for section, key in _config_keys(text)):
                return False
        except ValueError:
            return False
    return True


def _config_keys(text: str) -> Iterator[tuple[str, str]]:
    """``(section, key)``, lower case, of every setting in git config ``text``. Conservative: each line is
    read on its own (a continued value then reads as a setting, or fails), and anything else raises
    ValueError."""
    section = ""
    for raw in text.removeprefix("\ufeff").splitlines():
        line = raw.strip()
        while line and line[0] not in "#;":
            if line[0] == "[":
                end, quoted = 1, False
                while end < len(line) and (quoted or line[end] != "]"):
                    quoted ^= line[end] == '"'
                    end += 1
                if end >= len(line):
                    raise ValueError("unterminated section")
                header = line[1:end].strip()
                section = header.split(None, 1)[0].split(".", 1)[0].lower() if header else ""
                line = line[end + 1 :].strip()
                continue
            match = re.match(r"[A-Za-z][A-Za-z0-9-]*(?=\s*(=|$|[#;]))", line)
            if match is None or not section:
                raise ValueError(f"not a setting: {line[:40]!r}")
            yield section, match.group(0).lower()
            break


def _git_dirty(root: Path) -> bool | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_OPTIONAL_LOCKS="0", GIT_NO_LAZY_FETCH="1", GIT_TERMINAL_PROMPT="0")
    cmd = ["git", "--no-optional-locks", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false",
           "-c", f"core.hooksPath={os.devnull}", "-c", "submodule.recurse=false", "-c", "protocol.allow=never",
           "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--ignore-submodules=all"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=_GIT_TIMEOUT, env=env,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None

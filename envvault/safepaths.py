"""Where a restore may write: the one rule for paths and symlinks that a manifest names (docs/format.md,
"Threat model"), used by the environment restore and the cache restore alike.

Two layers. ``path_problem`` and ``link_target_problem`` read only the text of one entry (early, exact
refusals: absolute paths, ``..``, NUL). ``FinalTree`` then decides every entry against the tree as it will
be once the restore is done: every link the restore creates and every link already on disk is followed,
component by component the way the kernel does (a link before ``..`` is resolved before going up), so
``hop -> ../../..`` followed by ``out -> hop/../../../../etc`` is seen leading out. Going up (``..``) out of
a component that is neither a folder on disk nor a folder the restore makes is refused as well: such a
link is dangling today and would change meaning when a later restore creates that component.

Nothing here writes; the on-disk part is ``lstat``/``readlink`` only.
"""

from __future__ import annotations

import os
import re
import stat as statmod
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Iterable, Mapping

from envvault.model.paths import link_target_problem, path_problem  # the text rule lives in model/

__all__ = ["path_problem", "link_target_problem", "FinalTree", "env_key", "environment_key"]

_MAX_HOPS = 40  # like the kernel's limit on symlinks followed in one lookup


def env_key(path: str | os.PathLike) -> str:
    """The ``<key>`` of an environment's path (docs/format.md): the first 20 hex digits of the BLAKE3 of
    the resolved real path, so that one environment reached through a symlink shares its locks, stat cache
    and markers."""
    import blake3

    real = os.path.realpath(os.path.abspath(os.fspath(path)))
    return blake3.blake3(real.encode()).hexdigest()[:20]


def environment_key(path: str | os.PathLike, interpreter: str | os.PathLike | None = None) -> str:
    """``<key>[-<ikey>]``, naming an environment's machine-local files (docs/format.md): its ``env_key`` and,
    for a system environment, its interpreter's (several interpreters may share a root)."""
    return env_key(path) + (f"-{env_key(interpreter)}" if interpreter else "")


class _Out(Exception):
    """A lookup left the root (or could not be decided safely)."""


class FinalTree:
    """The tree under ``root`` as a restore will leave it: ``links`` (relative path -> target) are the
    symlinks it creates, ``entries`` the files it puts in place and ``dirs`` the folders it creates (both
    replace whatever is on disk there); everything else is read from disk. ``where`` names the root in
    messages ("the environment", "the cache root")."""

    def __init__(self, root: str | os.PathLike, *, links: Mapping[str, str] | None = None,
                 entries: Iterable[str] = (), dirs: Iterable[str] = (), where: str = "the environment"):
        self.root = os.path.abspath(os.fspath(root))
        self.real = os.path.realpath(self.root)
        self.where = where
        self.links = dict(links or {})
        self.entries = set(entries) - set(self.links)
        self.dirs = set(dirs) - set(self.links) - self.entries
        self._implied: set[str] = set()  # every folder above an entry, link or folder of the restore
        for paths in (self.links, self.entries, self.dirs):
            for p in paths:
                head = p.rpartition("/")[0]
                while head and head not in self._implied:  # a folder there has its own folders above it
                    self._implied.add(head)
                    head = head.rpartition("/")[0]
        self._disk: dict[str, tuple[str, str | None]] = {}
        self._dir_cache: dict[str, tuple[str, ...] | str] = {}
        self._disk_only = not (self.links or self.entries or self.dirs)

    # -- what lies at a path -----------------------------------------------------------------------

    def _on_disk(self, rel: str) -> tuple[str, str | None]:
        got = self._disk.get(rel)
        if got is None:
            full = os.path.join(self.real, rel) if rel else self.real
            try:
                st = os.lstat(full)
            except OSError:
                got = ("missing", None)
            else:
                if statmod.S_ISLNK(st.st_mode):
                    try:
                        got = ("link", os.readlink(full))
                    except OSError:
                        got = ("missing", None)
                elif statmod.S_ISDIR(st.st_mode):
                    got = ("dir", None)
                else:
                    got = ("other", None)
            self._disk[rel] = got
        return got

    def _kind(self, rel: str) -> tuple[str, str | None]:
        if not rel:
            return ("dir", None)
        if rel in self.links:
            return ("link", self.links[rel])
        if rel in self.entries:
            return ("other", None)
        if rel in self.dirs:
            return ("dir", None)
        kind = self._on_disk(rel)
        if kind[0] == "missing" and rel in self._implied:
            return ("dir", None)  # made by the restore for what it writes below
        return kind

    # -- lookups -----------------------------------------------------------------------------------

    def _abs_inside(self, target: str) -> list[str]:
        for base in (self.real, self.root):
            if target == base:
                return []
            if target.startswith(base.rstrip("/") + "/"):
                return target[len(base.rstrip("/")) + 1:].split("/")
        raise _Out(f"leads to {target}")

    def _walk(self, stack: list[str], parts: list[str], hops: list[int], follow_last: bool) -> list[str]:
        last = max((i for i, p in enumerate(parts) if p not in ("", ".")), default=-1)
        for i, part in enumerate(parts):
            if part in ("", "."):
                continue
            if part == "..":
                if not stack:
                    raise _Out("goes above the top")
                top = "/".join(stack)
                if self._kind(top)[0] != "dir":
                    raise _Out(f"goes back up out of {top}, which is not a folder")
                stack.pop()
                continue
            stack.append(part)
            kind, target = self._kind("/".join(stack))
            if kind != "link" or (i == last and not follow_last):
                continue
            hops[0] += 1
            if hops[0] > _MAX_HOPS:
                raise _Out("has too many levels of symlinks")
            stack.pop()
            if target.startswith("/"):
                stack = []
                sub = self._abs_inside(target)
            else:
                sub = target.split("/")
            stack = self._walk(stack, sub, hops, True)
        return stack

    def _dir(self, rel_dir: str) -> tuple[str, ...] | str:
        """Where folder ``rel_dir`` resolves (components under the root), or why it leads out."""
        got = self._dir_cache.get(rel_dir)
        if got is None:
            if not rel_dir:
                got = ()
            else:
                head, _, name = rel_dir.rpartition("/")
                up = self._dir(head)
                if isinstance(up, str):
                    got = up
                else:
                    try:
                        got = tuple(self._walk(list(up), [name], [0], True))
                    except _Out as err:
                        got = f"{rel_dir} {err}"
            self._dir_cache[rel_dir] = got
        return got

    def resolve(self, rel: str) -> str | None:
        """Where ``rel`` ends up, every symlink followed, relative to the root; None when it leads out."""
        head, _, name = rel.rpartition("/")
        up = self._dir(head)
        if isinstance(up, str):
            return None
        try:
            return "/".join(self._walk(list(up), [name], [0], True))
        except _Out:
            return None

    # -- the rule ----------------------------------------------------------------------------------

    def write_problem(self, rel: str) -> str | None:
        """Why nothing may be put at ``rel`` (a file, a folder or a symlink itself), or None: the path is
        well formed, no folder on its way is a symlink this restore creates, and every folder on its way
        resolves inside the root."""
        why = path_problem(rel)
        if why is not None:
            return why
        if self.links:  # the topmost folder on its way that is a symlink this restore creates
            up, under = rel.rpartition("/")[0], None
            while up:
                if up in self.links:
                    under = up
                up = up.rpartition("/")[0]
            if under is not None:
                return f"lies under {under}, a symlink this restore creates"
        up = self._dir(rel.rpartition("/")[0])
        if isinstance(up, str):
            return f"lies under a symlink that leads outside {self.where} ({up})"
        return None

    def link_problem(self, rel: str, target: object) -> str | None:
        """Why a symlink at ``rel`` to ``target`` may not be created, or None: in the final tree, with every
        link followed, it points inside the root."""
        why = link_target_problem(rel, target, self.where) or self.write_problem(rel)
        if why is not None:
            return why
        up = self._dir(rel.rpartition("/")[0])
        try:
            self._walk(list(up), target.split("/"), [0], True)
        except _Out as err:
            return f"is a symlink that leads outside {self.where} ({target}: {err})"
        return None

    def problems(self) -> list[str]:
        """Every entry of the restore checked against the final tree (``path: why``), and every symlink
        already on disk that the new symlinks would turn outward."""
        out = [f"{p}: {why}" for p in sorted(self.entries | self.dirs) if (why := self.write_problem(p))]
        out += [f"{p}: {why}" for p, t in sorted(self.links.items()) if (why := self.link_problem(p, t))]
        if self.links and not out:
            out += self._turned_outward()
        return out

    def _turned_outward(self) -> list[str]:
        """Symlinks already under the root, left alone by the restore, that resolve inside today but would
        lead out once the new symlinks exist (``x -> d/../..`` when the restore turns folder ``d`` into a
        symlink)."""
        today = FinalTree(self.root, where=self.where)
        found = []
        for dirpath, dirnames, filenames in os.walk(self.real):
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name)
                if not os.path.islink(full):
                    continue
                rel = os.path.relpath(full, self.real)
                if os.sep != "/":
                    rel = rel.replace(os.sep, "/")
                if rel in self.links or rel in self.entries or rel in self.dirs:
                    continue
                if self.resolve(rel) is None and today.resolve(rel) is not None:
                    found.append(f"{rel}: the symlink already there would lead out of {self.where} "
                                 "through the symlinks this restore creates")
        return found


_INTERPRETER = re.compile(r"python(\d+(\.\d+)?)?")


def reserved_problem(rel: str, scripts: Iterable[str]) -> str | None:
    """Why a restore of an environment may not put anything at ``rel``, inside though it is: the
    environment's own interpreter (``python``, ``python3``, ``python3.N`` in one of its ``scripts`` folders)
    and its ``pyvenv.cfg`` are the venv's, never a package's. A snapshot holding one (a hostile vault) would
    have its bytes run, or choose the standard library the interpreter loads, as soon as the restore checks
    the environment it wrote."""
    if rel == "pyvenv.cfg":
        return "is the environment's pyvenv.cfg, which no package installs"
    folder, _, name = rel.rpartition("/")
    if folder in scripts and _INTERPRETER.fullmatch(name):
        return "is the environment's interpreter, which no package installs"
    return None

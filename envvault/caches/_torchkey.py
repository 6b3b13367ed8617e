"""Inductor's ``torch_key()`` computed from an installed torch without importing it.

Mirrors ``torch/_inductor/codecache.py`` (torch 2.13; the same recipe back to at least 2.6):
``torch_key`` = sha256 over ``torch.__version__``, then ``build_code_hash([torch_dir], "", h)`` (for each
module ``pkgutil.iter_modules`` finds, sorted by name: its name, then the bytes of the file its spec
points at, recursing into packages), then ``_inductor/codegen/aoti_runtime/interface.cpp`` and
``_inductor/script.ld`` when present. Module discovery mirrors ``pkgutil._iter_file_finder_modules`` and
``importlib``'s ``FileFinder.find_spec`` with the *target* interpreter's file suffixes, which differ from
ours when the venv runs another Python.

Inductor keys graphs by this value, so an edited torch file (invisible to RECORD) changes it.
``fx_hash_of`` gives the short hash Inductor prints for it in a cache entry's debug lines
(``[<hash>] torch_version: ...``), which is what a cache tree can be checked against.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import pickle
import re
from pathlib import Path

__all__ = ["torch_source_key", "fx_hash_of", "extension_suffixes"]

_EXTRA_FILES = ("_inductor/codegen/aoti_runtime/interface.cpp", "_inductor/script.ld")


def extension_suffixes(torch_dir: Path, python_version: str | None) -> list[str]:
    """The target interpreter's extension-module suffixes, read off torch's own ``_C`` module name."""
    for name in sorted(os.listdir(torch_dir)):
        m = re.fullmatch(r"_C\.(cpython-\d+[a-z]*-[^.]+)\.so", name)
        if m:
            return [f".{m.group(1)}.so", ".abi3.so", ".so"]
    import importlib.machinery

    ours = list(importlib.machinery.EXTENSION_SUFFIXES)
    if python_version:
        major, minor = python_version.split(".")[:2]
        ours = [re.sub(r"cpython-\d+", f"cpython-{major}{minor}", s) for s in ours]
    return ours


def torch_source_key(torch_dir: Path, version: str, ext_suffixes: list[str]) -> bytes:
    """The 32 bytes ``torch._inductor.codecache.torch_key()`` returns for the torch at ``torch_dir``."""
    hasher = hashlib.sha256()
    hasher.update(version.encode("utf-8"))
    finder = _Finder(ext_suffixes)
    finder.build_code_hash(str(torch_dir), "", hasher)
    for rel in _EXTRA_FILES:
        path = os.path.join(torch_dir, rel)
        if os.path.exists(path):
            hasher.update(_read(path))
    return hasher.digest()


_READ_LIMIT = 1 << 30  # a module of torch's (its extension modules included)


def _read(path: str) -> bytes:
    """A file of the torch package: a FIFO or a device put in its place is never waited on."""
    from envvault.errors import CorruptError, EnvironmentProblem
    from envvault.vault.fsutil import read_regular

    try:
        return read_regular(path, _READ_LIMIT, path, follow=True)
    except (OSError, CorruptError) as err:
        raise EnvironmentProblem(f"cannot read {path} for torch's cache key: {err}") from None


def fx_hash_of(value: object) -> str:
    """``FxGraphCachePickler.get_hash(value)`` for plain values: base32 of sha256 of a fast-mode pickle."""
    stream = io.BytesIO()
    pickler = pickle.Pickler(stream)
    pickler.fast = True  # as Inductor's pickler: no memo, so equal values pickle to equal bytes
    pickler.dump(value)
    digest = hashlib.sha256(stream.getvalue()).digest()
    return base64.b32encode(digest)[:51].decode("ascii").lower()


class _Finder:
    def __init__(self, ext_suffixes: list[str]) -> None:
        # FileFinder's loader order: extension modules, then sources, then bytecode.
        self.loader_suffixes = [*ext_suffixes, ".py", ".pyc"]
        by_length = sorted((-len(s), s) for s in [".py", ".pyc", *ext_suffixes])
        self.name_suffixes = [s for _, s in by_length]  # inspect.getmodulename: longest first
        self._listings: dict[str, set[str]] = {}

    def build_code_hash(self, folder: str, prefix: str, hasher: "hashlib._Hash") -> None:
        for name, ispkg in sorted(self.iter_modules(folder, prefix)):
            origin, search = self.find_spec(folder, name)
            data = _read(origin)
            hasher.update(name.encode("utf-8"))
            hasher.update(data)
            if ispkg and search is not None:
                self.build_code_hash(search, f"{name}.", hasher)

    def module_name(self, filename: str) -> str | None:
        for suffix in self.name_suffixes:
            if filename.endswith(suffix):
                return filename[: -len(suffix)]
        return None

    def iter_modules(self, folder: str, prefix: str) -> list[tuple[str, bool]]:
        try:
            filenames = sorted(os.listdir(folder))
        except OSError:
            return []
        found: list[tuple[str, bool]] = []
        yielded: set[str] = set()
        for fn in filenames:
            modname = self.module_name(fn)
            if modname == "__init__" or modname in yielded:
                continue
            path = os.path.join(folder, fn)
            ispkg = False
            if not modname and os.path.isdir(path) and "." not in fn:
                try:
                    contents = os.listdir(path)
                except OSError:
                    contents = []
                if not any(self.module_name(c) == "__init__" for c in contents):
                    continue
                modname, ispkg = fn, True
            if modname and "." not in modname:
                yielded.add(modname)
                found.append((prefix + modname, ispkg))
        return found

    def find_spec(self, folder: str, fullname: str) -> tuple[str, str | None]:
        """(origin, package folder or None) as ``FileFinder(folder).find_spec(fullname)`` gives them."""
        tail = fullname.rpartition(".")[2]
        listing = self._listings.get(folder)
        if listing is None:
            listing = self._listings[folder] = set(os.listdir(folder))
        if tail in listing:
            base = os.path.join(folder, tail)
            for suffix in self.loader_suffixes:
                init = os.path.join(base, "__init__" + suffix)
                if os.path.isfile(init):
                    return init, base
        for suffix in self.loader_suffixes:
            path = os.path.join(folder, tail + suffix)
            if tail + suffix in listing and os.path.isfile(path):
                return path, None
        from envvault.errors import EnvironmentProblem  # torch's own key computation fails here too (no spec)

        raise EnvironmentProblem(f"cannot read {os.path.join(folder, tail)}: no module file for {fullname} (a "
                                 "FIFO, a device or a folder where torch has a module); torch's cache key cannot "
                                 "be computed")

"""A vault on S3-compatible object storage (``--vault s3://BUCKET/PREFIX``): :class:`S3Backend`.

The client is obstore (``pip install 'envvault[s3]'``; why obstore: docs/format.md, "Object storage"),
imported only when an ``s3://`` vault is used. Which locations are URLs: ``envvault/vault/location.py``.

Endpoint and credentials come from the standard AWS variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``), read by obstore, and
from the profile ``AWS_PROFILE`` (default ``default``) of ``~/.aws/credentials`` and ``~/.aws/config``
(``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``) for what the variables leave unset.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from envvault.errors import CorruptError, NotFoundError, StorageError, UsageError
from envvault.vault.backend import DEFAULT_LIMIT, Missing, ObjectInfo, ReadFailed, check_kind
from envvault.vault.location import S3Url, parse_s3_url
from envvault.vault.threads import env_count

__all__ = ["S3Backend", "open_vault"]



def open_vault(vault_cls: Any, url: str, *, create: bool = False) -> Any:
    """The Vault at ``url`` (called by ``Vault.open``): objects in the bucket; an :class:`ObjectCache` and the
    machine-local state in this node's cache folder for that vault, named by the vault's ``vault_id`` (the
    same vault reached through another endpoint shares it; a different vault under the same name does not)."""
    from envvault.vault.objcache import ObjectCache, cache_root, vault_cache_dir
    from envvault.vault.state import LocalState

    parsed = parse_s3_url(url)
    backend = S3Backend(str(parsed))
    vid = _vault_id(backend)
    if vid is None:
        if not create:
            raise NotFoundError(f"no vault at {backend.location}; run `envvault snap` first or pass --vault")
        scratch = cache_root() / "tmp"
        vault_cls.from_backend(backend, LocalState(scratch, scratch, scratch), create=True)  # writes config.json
        vid = _vault_id(backend)
    home = vault_cache_dir(vid or f"{os.environ.get('AWS_ENDPOINT_URL', '')}|{parsed}")
    state = LocalState(home / "state", home / "tmp", home / "locks")
    try:
        for sub in ("state", "tmp", "locks", "objects"):
            (home / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as err:
        raise StorageError(f"cannot make the local cache {home}: {err.strerror or err}; set ENVVAULT_CACHE_DIR")
    backend.cache = ObjectCache(home / "objects")
    backend.on_gc_epoch = lambda value: _follow_gc_epoch(state, value)
    return vault_cls.from_backend(backend, state, create=create)


def _vault_id(backend: "S3Backend") -> str | None:
    """The vault's ``vault_id`` ("" when config.json is damaged), None when there is no config.json."""
    from envvault.model.encoding import json_loads

    try:
        doc = json_loads(backend.load("config", "config", limit=1 << 20))
    except Missing:
        return None
    except (ValueError, CorruptError):
        return ""
    vid = doc.get("vault_id") if isinstance(doc, dict) else None
    return vid if isinstance(vid, str) and re.fullmatch(r"[0-9a-f]{32}", vid) else ""


def _follow_gc_epoch(state: Any, value: str) -> None:
    """A gc ran somewhere since this node last looked: forget this node's stat caches (they name objects
    without asking the index) and move the local epoch on, so a scan that loaded one cannot save it back."""
    seen = state.read("remote-gc-epoch", 4096)
    if seen is not None and seen.decode("ascii", "replace") == value:
        return
    state.forget_stat_caches()
    state.write("remote-gc-epoch", value.encode(), durable=False)


# -- the backend -----------------------------------------------------------------------------------------

_T = TypeVar("_T")
_ID = re.compile(r"^[0-9a-f]{64}$")
_SUFFIX = {"packs": ".pack", "index": ".idx", "snapshots": ".json", "tags": "", "locks": ".json"}
_CONFIG_NAMES = {"config": "config.json", "settings": "settings.json"}
# Attempts of one call after obstore's own retries (5xx, dropped connections) gave up, with backoff.
RETRIES = env_count("ENVVAULT_S3_RETRIES", 1, 100, 6)
# A command that fetched this many snapshot documents one by one leaves a bundle of them for the next node.
BUNDLE_MIN = 32
# Objects fetched into the node cache at once by ``prefetch`` (a restore's packs, a cold node's index files).
FETCHERS = env_count("ENVVAULT_S3_FETCHERS", 1, 64, 8)


def _ob():
    import obstore

    return obstore


class _Errors:
    """obstore's exceptions, grouped (some come as the builtin OSError kinds)."""

    def __init__(self) -> None:
        import obstore.exceptions as e

        self.NotFoundError = (e.NotFoundError, FileNotFoundError)
        self.AlreadyExistsError = (e.AlreadyExistsError, FileExistsError)
        self.PreconditionError = (e.PreconditionError,)
        self.NotSupportedError = (e.NotSupportedError, NotImplementedError)
        self.denied = (e.PermissionDeniedError, e.UnauthenticatedError, PermissionError)
        self.BaseError = (e.BaseError, OSError)


_ERRORS: _Errors | None = None


def _exc() -> _Errors:
    global _ERRORS
    if _ERRORS is None:
        _ERRORS = _Errors()
    return _ERRORS


def _aws_profile() -> dict[str, str]:
    """Static keys, region and endpoint of ``AWS_PROFILE`` from ~/.aws/credentials and ~/.aws/config, for what
    the AWS_* variables leave unset (obstore reads the variables itself)."""
    import configparser

    profile = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    home = Path.home()
    cred_file = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    conf_file = Path(os.environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    out: dict[str, str] = {}
    for path, section in ((conf_file, profile if profile == "default" else f"profile {profile}"),
                          (cred_file, profile)):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (OSError, configparser.Error):
            continue
        if parser.has_section(section):
            out.update({k.strip().lower(): v.strip() for k, v in parser.items(section)})
    if os.environ.get("AWS_PROFILE") and not out:
        raise UsageError(f"AWS profile {profile!r} is not in {cred_file} or {conf_file}")
    return out


def _make_store(url: S3Url):
    from obstore.store import S3Store

    config: dict[str, Any] = {}
    if not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
        prof = _aws_profile()
        for ours, theirs in (("aws_access_key_id", "access_key_id"), ("aws_secret_access_key", "secret_access_key"),
                             ("aws_session_token", "session_token")):
            if prof.get(ours):
                config[theirs] = prof[ours]
        if not os.environ.get("AWS_REGION") and not os.environ.get("AWS_DEFAULT_REGION") and prof.get("region"):
            config["region"] = prof["region"]
        if not (os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")) and \
                prof.get("endpoint_url"):
            config["endpoint"] = prof["endpoint_url"]
    endpoint = config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or config.get("region")):
        config["region"] = "us-east-1"
    if endpoint:
        config["endpoint"] = endpoint
        config.setdefault("virtual_hosted_style_request", False)
    client: dict[str, Any] = {"timeout": os.environ.get("ENVVAULT_S3_TIMEOUT", "120s"), "connect_timeout": "10s"}
    if endpoint and endpoint.startswith("http://"):
        client["allow_http"] = True
    retry = {"max_retries": 4, "retry_timeout": _td(60),
             "backoff": {"init_backoff": _td(0.1), "max_backoff": _td(5), "base": 2}}
    return S3Store(url.bucket, prefix=url.prefix or None, config=config, client_options=client,
                   retry_config=retry)


def _td(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)


class S3Backend:
    """A vault's shared objects in ``s3://BUCKET/PREFIX``, under the names of the local tree (docs/format.md,
    "Object storage"): ``config.json``, ``packs/<aa>/<id>.pack``, ``index/<id>.idx``, ``snapshots/<id>.json``,
    ``tags/<name>``; lock objects ``locks/<name>-<holder>.json``.

    ``cache``: a :class:`~envvault.vault.cache.ObjectCache` for immutable objects (packs, index files,
    snapshots): each is read from the bucket once per node, whole, checked against its name, then read
    locally; packs this node uploads go into it instead of being deleted."""

    def __init__(self, url: str, *, store: Any = None, cache: Any = None):
        self.url = parse_s3_url(url)
        self.location = str(self.url)
        self.store = store if store is not None else _make_store(self.url)
        self.cache = cache
        self.requests = 0  # calls made to the bucket (tests and `--debug` figures)
        self.lost: list[str] = []  # locks whose object vanished while held (gc called them stale)
        # Called with the bucket's gc epoch once the vault lock is held (open_vault: drop stale stat caches).
        self.on_gc_epoch: Callable[[str], None] | None = None
        # Snapshot bundles (docs/format.md, "Object storage"): what this process listed and fetched.
        self._listed_snapshots: set[str] | None = None
        self._snapshot_fetches = 0
        self._bundles: dict[str, frozenset] | None = None  # bundle name -> the snapshot ids it holds
        self._head_share: Any = None  # s3_heads.HeadShare, made on first use
        # config.json as this process read or wrote it: written once when the vault is made, so one GET a
        # command (opening a vault had asked for it three times)
        self._config: bytes | None = None
        # Fetches into the cache under way ((kind, name) -> Event set when done): one GET per object even
        # when several threads (or the prefetchers) want it at once.
        self._fetching: dict[tuple[str, str], threading.Event] = {}
        self._fetch_mutex = threading.Lock()
        self._queue: list[tuple[str, str]] = []  # prefetch: what is left to fetch, in order
        self._fetchers = 0

    # -- names ----------------------------------------------------------------------------------
    def key(self, kind: str, name: str) -> str:
        check_kind(kind)
        if not name or "/" in name or "\0" in name or name in (".", "..") or name.startswith("."):
            raise ValueError(f"bad object name {name!r}")
        if kind == "config":
            try:
                return _CONFIG_NAMES[name]
            except KeyError:
                raise ValueError(f"bad config name {name!r}") from None
        if kind == "packs":
            return f"packs/{name[:2]}/{name}.pack"
        return f"{kind}/{name}{_SUFFIX[kind]}"

    def where(self, kind: str, name: str) -> str:
        return f"{self.location}/{self.key(kind, name)}"

    # -- calls, retried ---------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        """``fn()`` with retries and backoff on what may pass (timeouts, 5xx, cut connections); an error that
        will not pass (credentials, a missing bucket) is one StorageError line at once."""
        import random

        exc = _exc()
        delay = 0.2
        for attempt in range(RETRIES):
            self.requests += 1
            try:
                return fn()
            except exc.NotFoundError + exc.AlreadyExistsError + exc.PreconditionError + exc.NotSupportedError as err:
                fatal = _fatal_reason(str(err))
                if fatal:  # a 404 for the bucket, not the object
                    raise StorageError(f"{self.location}: {fatal}") from None
                raise
            except _TooBig:
                raise
            except exc.denied as err:
                raise StorageError(f"{self.location}: access denied ({_first_line(err)}); check AWS_ACCESS_KEY_ID/"
                                   "AWS_SECRET_ACCESS_KEY or AWS_PROFILE") from None
            except exc.BaseError as err:
                text = str(err)
                fatal = _fatal_reason(text)
                if fatal:
                    raise StorageError(f"{self.location}: {fatal}") from None
                if attempt == RETRIES - 1:
                    raise StorageError(f"{self.location}: {what} failed after {RETRIES} attempts: "
                                       f"{_first_line(err)}") from None
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    # -- the Backend protocol -----------------------------------------------------------------------
    def save(self, kind: str, name: str, data: bytes, *, exclusive: bool = False) -> bool:
        key = self.key(kind, name)
        if kind == "snapshots" and self.lost:
            raise StorageError(f"{self.location}: the lock {self.lost[0]} was taken away (stale by "
                               "docs/format.md's rule) while this command ran; nothing was committed, run it again")
        ob, exc = _ob(), _exc()
        # Content-named kinds are never rewritten: create-if-absent even when not asked (same name, same bytes).
        create = exclusive or kind in ("packs", "index", "snapshots")
        try:
            self._call(f"writing {key}", lambda: ob.put(self.store, key, bytes(data),
                                                        mode="create" if create else "overwrite",
                                                        use_multipart=False))
        except exc.AlreadyExistsError + exc.PreconditionError:
            if exclusive:
                return False
        except exc.NotSupportedError:  # a store without conditional writes: best effort
            if exclusive and self._exists(key):
                return False
            self._call(f"writing {key}", lambda: ob.put(self.store, key, bytes(data), use_multipart=False))
        if self.cache is not None and kind in ("index", "snapshots"):
            self.cache.put_bytes(kind, name, data)
        if kind == "config" and name == "config":
            self._config = bytes(data)
        if kind == "snapshots" and self._listed_snapshots is not None:
            self._listed_snapshots.add(name)
        return True

    def save_file(self, kind: str, name: str, local_path: Path) -> None:
        local_path = Path(local_path)
        key = self.key(kind, name)
        ob, exc = _ob(), _exc()
        size = local_path.stat().st_size
        try:
            if size <= (64 << 20):
                data = local_path.read_bytes()
                self._call(f"writing {key}", lambda: ob.put(self.store, key, data, mode="create",
                                                            use_multipart=False))
            else:  # a large object: multipart (overwrite: its name is its content)
                self._call(f"writing {key}", lambda: ob.put(self.store, key, local_path, chunk_size=8 << 20,
                                                            max_concurrency=8))
        except exc.AlreadyExistsError + exc.PreconditionError:
            pass  # the same name holds the same bytes
        if self.cache is not None and kind in ("packs", "index", "snapshots"):
            self.cache.adopt(kind, name, local_path)
        else:
            local_path.unlink(missing_ok=True)

    def load(self, kind: str, name: str, offset: int = 0, length: int | None = None, *,
             limit: int = DEFAULT_LIMIT) -> bytes:
        key = self.key(kind, name)
        if self.cache is not None and kind in ("packs", "index", "snapshots"):
            where = self.where(kind, name)
            if kind == "snapshots":
                # A cached document is used only while the bucket lists it (gc elsewhere may have deleted it).
                if self._listed_snapshots is None or name not in self._listed_snapshots:
                    if name not in self.list("snapshots"):
                        raise Missing(f"snapshots {name} not found in {self.location}")
            for attempt in range(4):
                data = self.cache.read(kind, name, offset, length, limit, where)
                if data is not None:
                    return data
                if kind == "snapshots" and self._bundles is None:
                    self._load_bundles()
                    continue
                if kind == "snapshots":
                    self._count_snapshot_fetch()
                try:
                    self._fetch_once(kind, name, key, limit if kind != "packs" else None)
                except CorruptError:
                    if attempt:
                        raise
            raise ReadFailed(f"cannot keep {where} in the local cache {self.cache.root}", "evicted")
        if kind == "config" and name == "config" and self._config is not None and length is None \
                and len(self._config) <= limit:
            return self._config[offset:]
        ob, exc = _ob(), _exc()
        try:
            if length is None:
                def whole():
                    res = ob.get(self.store, key)
                    size = res.meta["size"]
                    if size > limit:
                        raise _TooBig(size)
                    return bytes(res.bytes())

                try:
                    data = self._call(f"reading {key}", whole)
                    if kind == "config" and name == "config":
                        self._config = data
                    return data[offset:]
                except _TooBig as big:
                    raise CorruptError(f"{self.where(kind, name)} is {big.size} bytes, over the limit of {limit}")
            if length <= 0:
                return b""
            return bytes(self._call(f"reading {key}", lambda: ob.get_range(self.store, key, start=offset,
                                                                          length=length)))
        except exc.NotFoundError:
            raise Missing(f"{kind} {name} not found in {self.location}") from None
        except StorageError as err:
            if length is not None and "range" in str(err).lower():
                return b""  # a range past the end
            raise ReadFailed(str(err), str(err)) from None

    def _fetch_once(self, kind: str, name: str, key: str, limit: int | None) -> None:
        """``_fetch_into_cache``, or wait for the fetch of the same object another thread has under way
        (its failure is not raised here: the caller finds the object absent and fetches it itself)."""
        with self._fetch_mutex:
            done = self._fetching.get((kind, name))
            mine = done is None
            if mine:
                done = self._fetching[(kind, name)] = threading.Event()
        if not mine:
            done.wait()
            return
        try:
            if os.path.exists(self.cache.path(kind, name)):
                return  # a fetch that ended between the caller's look and this one
            self._fetch_into_cache(kind, name, key, limit)
        finally:
            with self._fetch_mutex:
                del self._fetching[(kind, name)]
            done.set()

    def prefetch(self, kind: str, names: list[str], sizes: dict[str, int] | None = None) -> None:
        """Start fetching ``names`` (packs or index files) into the node cache, in this order, ``FETCHERS``
        at a time on background threads; a ``load`` of one of them waits for its fetch instead of making
        another. Stops at half the cache's limit (``sizes``: what each is expected to weigh), so that
        nothing prefetched is evicted before it is read. An optimisation: failures are left to ``load``."""
        if self.cache is None or kind not in ("packs", "index"):
            return
        budget = self.cache.limit // 2
        todo = []
        for name in dict.fromkeys(names):
            if os.path.exists(self.cache.path(kind, name)):
                continue
            budget -= (sizes or {}).get(name, 0)
            if budget < 0:
                break
            todo.append((kind, name))
        if not todo:
            return
        with self._fetch_mutex:
            self._queue.extend(todo)
            start = min(FETCHERS, len(self._queue)) - self._fetchers
            self._fetchers += max(start, 0)
        for _ in range(start):
            # daemon threads: a command that stops early does not wait for the rest of the queue
            threading.Thread(target=self._prefetcher, name="envvault-s3-fetch", daemon=True).start()

    def _prefetcher(self) -> None:
        while True:
            with self._fetch_mutex:
                if not self._queue:
                    self._fetchers -= 1
                    return
                kind, name = self._queue.pop(0)
            try:
                if not os.path.exists(self.cache.path(kind, name)):
                    self._fetch_once(kind, name, self.key(kind, name), None if kind == "packs" else DEFAULT_LIMIT)
            except Exception:  # noqa: BLE001 - the reader's own load reports it
                pass

    def _fetch_into_cache(self, kind: str, name: str, key: str, limit: int | None) -> None:
        ob, exc = _ob(), _exc()

        def fetch():
            res = ob.get(self.store, key)
            if limit is not None and res.meta["size"] > limit:
                raise _TooBig(res.meta["size"])
            return res

        try:
            res = self._call(f"reading {key}", fetch)
            self.cache.put_stream(kind, name, res, self.where(kind, name))
        except exc.NotFoundError:
            raise Missing(f"{kind} {name} not found in {self.location}") from None
        except _TooBig as big:
            raise CorruptError(f"{self.where(kind, name)} is {big.size} bytes, over the limit of {limit}") from None

    def stat(self, kind: str, name: str) -> ObjectInfo:
        key = self.key(kind, name)
        if kind == "config" and name == "config" and self._config is not None:
            return ObjectInfo(name, len(self._config))
        ob, exc = _ob(), _exc()
        try:
            meta = self._call(f"reading {key}", lambda: ob.head(self.store, key))
        except exc.NotFoundError:
            raise Missing(f"{kind} {name} not found in {self.location}") from None
        return ObjectInfo(name, int(meta["size"]))

    def _exists(self, key: str) -> bool:
        ob, exc = _ob(), _exc()
        try:
            self._call(f"reading {key}", lambda: ob.head(self.store, key))
            return True
        except exc.NotFoundError:
            return False

    def _list_meta(self, prefix: str) -> list[dict]:
        ob = _ob()

        def run():
            out = []
            for batch in ob.list(self.store, prefix, chunk_size=1000):
                out.extend(batch)
            return out

        try:
            return self._call(f"listing {prefix}", run)
        except _exc().NotFoundError:
            return []

    def list(self, kind: str) -> list[str]:
        check_kind(kind)
        if kind == "config":
            return [n for n, key in _CONFIG_NAMES.items()
                    if (n == "config" and self._config is not None) or self._exists(key)]
        suffix = _SUFFIX[kind]
        out = []
        for meta in self._list_meta(f"{kind}/"):
            rest = meta["path"][len(kind) + 1:]
            if kind == "packs":
                aa, _, rest = rest.partition("/")
                if "/" in rest or not rest.startswith(aa):
                    continue
            if "/" in rest or not rest.endswith(suffix) or rest.startswith("."):
                continue
            name = rest[: len(rest) - len(suffix)] if suffix else rest
            if kind in ("packs", "index", "snapshots") and not _ID.match(name):
                continue
            if name:
                out.append(name)
        if kind == "snapshots":
            self._listed_snapshots = set(out)
        return out

    # -- snapshot heads (s3_heads.py) ----------------------------------------------------------------
    def _heads(self) -> Any:
        if self._head_share is None:
            from envvault.vault.s3_heads import HeadShare

            self._head_share = HeadShare(self)
        return self._head_share

    def shared_heads(self, ids: set[str]) -> dict[str, dict]:
        """The heads the bucket's ``heads/`` objects hold of ``ids`` (``vault/heads.py`` parses them)."""
        return self._heads().shared(ids)

    def share_head(self, sid: str, head: dict) -> None:
        """A snapshot just committed: its head joins the bucket's heads objects (merged, so they stay few)."""
        self._heads().add(sid, head)

    def remember_heads(self, heads: dict[str, dict], computed: int) -> None:
        """The heads a listing has (``computed`` of them from documents): shared at exit when that spares
        the next node parsing many documents."""
        self._heads().remember(heads, computed)

    def get_key(self, key: str, limit: int) -> bytes | None:
        """The bytes at a key outside the kinds (``heads/``), None when it is gone or holds more than
        ``limit`` bytes (refused from the response's size, before its body is read)."""
        ob = _ob()

        def fetch():
            res = ob.get(self.store, key)
            return None if res.meta["size"] > limit else bytes(res.bytes())

        try:
            return self._call(f"reading {key}", fetch)
        except _exc().NotFoundError:
            return None

    def create_key(self, key: str, data: bytes) -> None:
        """Write a key outside the kinds unless it exists (content-named: the same bytes)."""
        try:
            self._call(f"writing {key}", lambda: _ob().put(self.store, key, data, mode="create", use_multipart=False))
        except _exc().AlreadyExistsError + _exc().PreconditionError:
            pass

    def delete_key(self, key: str) -> None:
        self._call(f"deleting {key}", lambda: _ob().delete(self.store, key))

    def list_keys(self, prefix: str) -> list[str]:
        """The keys under ``prefix`` (outside the kinds), relative to the vault's prefix."""
        return [m["path"] for m in self._list_meta(prefix)]

    # -- snapshot bundles --------------------------------------------------------------------------
    def _load_bundles(self) -> None:
        """Fill the cache from every bundle not seen yet (each doc checked against its id)."""
        import json

        from envvault.model.encoding import json_loads, object_id

        self._bundles = {}
        if self.cache is None:
            return
        try:
            metas = self._list_meta("bundles/")
        except StorageError:
            return
        for meta in metas:
            name = meta["path"][len("bundles/"):]
            if not name.endswith(".json") or not _ID.match(name[:-5]):
                continue
            bid = name[:-5]
            seen = self.cache.path("bundles", bid)
            try:
                if seen.exists():
                    self._bundles[bid] = frozenset(json_loads(seen.read_bytes()))
                    continue
                data = self.get_key(meta["path"], DEFAULT_LIMIT)  # refused by its size before it is read
                if data is None or object_id(data) != bid:
                    continue
                docs = json_loads(data).get("snapshots", {})
                held = []
                for sid, text in docs.items():
                    raw = text.encode() if isinstance(text, str) else b""
                    if _ID.match(sid) and object_id(raw) == sid:
                        self.cache.put_bytes("snapshots", sid, raw)
                        held.append(sid)
                self._bundles[bid] = frozenset(held)
                self.cache.put_bytes("bundles", bid, json.dumps(sorted(held)).encode())
            except (StorageError, ValueError, AttributeError, OSError) + _exc().NotFoundError:
                continue

    def _count_snapshot_fetch(self) -> None:
        self._snapshot_fetches += 1
        if self._snapshot_fetches == BUNDLE_MIN:
            import atexit

            atexit.register(self.write_bundle)

    def write_bundle(self) -> str | None:
        """Write one bundle of every listed snapshot this node holds in its cache, when it saves
        ``BUNDLE_MIN`` or more GETs to the next node; delete the bundles it makes redundant. An optimisation:
        any failure leaves things as they were."""
        from envvault.model.encoding import canonical_json, object_id

        if self.cache is None or self._listed_snapshots is None:
            return None
        try:
            docs = {}
            for sid in sorted(self._listed_snapshots):
                data = self.cache.read("snapshots", sid, 0, None, DEFAULT_LIMIT, sid)
                if data is not None and object_id(data) == sid:
                    docs[sid] = data.decode("utf-8")
            covered = set().union(*self._bundles.values()) if self._bundles else set()
            if len(set(docs) - covered) < BUNDLE_MIN:
                return None
            data = canonical_json({"format": 1, "snapshots": docs})
            bid = object_id(data)
            key = f"bundles/{bid}.json"
            try:
                self._call(f"writing {key}", lambda: _ob().put(self.store, key, data, mode="create",
                                                               use_multipart=False))
            except _exc().AlreadyExistsError + _exc().PreconditionError:
                pass
            for old, held in (self._bundles or {}).items():
                if old != bid and held <= set(docs):
                    self._call(f"deleting bundles/{old}.json", lambda: _ob().delete(self.store, f"bundles/{old}.json"))
            return bid
        except (StorageError, OSError, UnicodeDecodeError):
            return None

    def remove(self, kind: str, name: str) -> bool:
        key = self.key(kind, name)
        if not self._exists(key):
            return False
        self._call(f"deleting {key}", lambda: _ob().delete(self.store, key))
        if self.cache is not None and kind in ("packs", "index", "snapshots"):
            self.cache.discard(kind, name)
        if kind == "snapshots" and self._listed_snapshots is not None:
            self._listed_snapshots.discard(name)
        return True

    # -- locks (lockobjects.py) -----------------------------------------------------------------
    def lock(self, name: str, *, exclusive: bool, wait: bool = True):
        """The named lock as lock objects in the bucket (``lockobjects.hold``)."""
        from envvault.vault.lockobjects import hold

        return hold(self, name, exclusive=exclusive, wait=wait)

    def list_meta(self, prefix: str) -> list[dict]:
        """The keys under ``prefix`` with their metadata (``path``, ``last_modified``: the server's clock)."""
        return self._list_meta(prefix)

    def put_key(self, key: str, data: bytes) -> None:
        """Write (or replace) a key outside the content-named kinds: lock objects, ``gc-epoch``."""
        self._call(f"writing {key}", lambda: _ob().put(self.store, key, data, use_multipart=False))

    def exists_key(self, key: str) -> bool:
        return self._exists(key)


class _TooBig(Exception):
    def __init__(self, size: int):
        self.size = size


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__


def _fatal_reason(text: str) -> str | None:
    low = text.lower()
    if "nosuchbucket" in low or "bucket does not exist" in low or "specified bucket does not exist" in low:
        return "the bucket does not exist (create it, or fix the URL)"
    if "invalidaccesskeyid" in low or "signaturedoesnotmatch" in low or "accessdenied" in low or " 403" in low:
        return "access denied; check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
    if "no credentials" in low or "missing credentials" in low:
        return "no credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
    return None

"""Figures of issue 12 for a vault in a bucket, beside their anchors, in one run against moto on 127.0.0.1.

    python bench/bench_s3.py VENV        (VENV: the torch venv; prints one JSON document)

- push: `envvault sync LOCAL s3://` of the venv's snapshot vs one multipart upload (obstore) of the venv as
  a .tar.zst (tar | zstd -3, made beforehand, not timed); also `snap` straight into the bucket
- restore on an empty node: `restore --into` vs downloading that .tar.zst (obstore) and extracting it (both
  straight from moto)
- second restore on the same node: bytes read from the bucket (through a counting proxy)
- `list` of 1,000 snapshots on an empty node once a bundle exists: seconds and requests
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from s3server import FaultProxy, S3Server  # noqa: E402


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    venv = Path(sys.argv[1]).absolute()
    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    server = S3Server(work / "moto.log")
    bucket = server.bucket("bench")
    proxy = FaultProxy(server.port, rate=0.0)
    figures: dict = {}

    def env(node: str, vault: str, endpoint: str | None = None) -> dict:
        e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "VIRTUAL_ENV"}
        e.update(server.env(endpoint), ENVVAULT_HOME=vault, ENVVAULT_CACHE_DIR=str(work / f"cache-{node}"),
                 PYTHONPATH=str(ROOT))
        return e

    def ev(e: dict, *args) -> str:
        proc = subprocess.run([sys.executable, "-m", "envvault", *map(str, args)], env=e, capture_output=True,
                              text=True)
        if proc.returncode:
            raise SystemExit(f"envvault {args} failed: {proc.stderr}")
        return proc.stdout

    try:
        import obstore
        from obstore.store import S3Store

        store = S3Store(bucket, endpoint=server.url, region="us-east-1", access_key_id=server.KEY,
                        secret_access_key=server.SECRET, client_options={"allow_http": True},
                        virtual_hosted_style_request=False)
        tarball = work / "venv.tar.zst"
        subprocess.run(["tar", "-C", str(venv.parent), "-I", "zstd -3 -T0", "-cf", str(tarball), venv.name],
                       check=True)
        figures["tar_zst_bytes"] = tarball.stat().st_size
        figures["anchor_multipart_upload_s"], _ = timed(lambda: obstore.put(store, "anchor/venv.tar.zst", tarball,
                                                                            chunk_size=8 << 20))

        local = work / "local-vault"
        lenv = env("local", str(local))
        sid = json.loads(ev(lenv, "snap", "--no-caches", "--venv", venv, "--json"))["id"]
        url = f"s3://{bucket}/vault"
        figures["push_sync_s"], _ = timed(lambda: ev(env("a", url), "sync", local, url))
        figures["snap_into_bucket_s"], _ = timed(lambda: ev(env("a2", f"s3://{bucket}/direct"), "snap",
                                                             "--no-caches", "--venv", venv))
        figures["snap_into_local_vault_s"], _ = timed(lambda: ev(env("l2", str(work / "local2")), "snap",
                                                                  "--no-caches", "--venv", venv))

        def anchor_restore():
            dest = work / "anchor-extract"
            dest.mkdir()
            with open(work / "dl.tar.zst", "wb") as f:
                for chunk in obstore.get(store, "anchor/venv.tar.zst").stream():
                    f.write(chunk)
            subprocess.run(["tar", "-C", str(dest), "-I", "zstd -T0", "-xf", str(work / "dl.tar.zst")], check=True)

        figures["anchor_download_extract_s"], _ = timed(anchor_restore)
        # The first restore reaches moto directly, as the anchor's download does (the counting proxy is a
        # Python relay: it costs what no real node pays); the second, on the same node (its cache is named
        # by the vault, not the endpoint), goes through the proxy so that its bytes are counted.
        figures["restore_into_empty_node_s"], _ = timed(lambda: ev(env("b", url), "restore", sid, "--into",
                                                                   work / "r1"))
        b = env("b", url, proxy.url)
        before = dict(proxy.counts)
        figures["second_restore_same_node_s"], _ = timed(lambda: ev(b, "restore", sid, "--into", work / "r2"))
        figures["second_restore_remote_bytes"] = proxy.counts["bytes_down"] - before["bytes_down"]
        figures["second_restore_requests"] = proxy.counts["requests"] - before["requests"]

        # 1,000 snapshots: the real document with 1,000 messages, committed as snaps commit (each shares its
        # head: docs/format.md, "Snapshot heads"), eight writers at a time
        from envvault.model.snapshot import parse_snapshot
        from envvault.vault.store import Vault

        os.environ.update(server.env(), ENVVAULT_CACHE_DIR=str(work / "cache-writers"))
        doc = json.loads(Vault.open(url).backend.load("snapshots", sid))
        from concurrent.futures import ThreadPoolExecutor

        def put(i: int) -> None:
            Vault.open(url).commit_snapshot(parse_snapshot(dict(doc, message=f"run {i}")))

        figures["commit_999_snapshots_s"], _ = timed(lambda: list(ThreadPoolExecutor(8).map(put, range(999))))
        before = dict(proxy.counts)
        figures["list_1000_first_node_s"], _ = timed(lambda: ev(env("c", url, proxy.url), "list", "--all"))
        figures["list_1000_first_node_requests"] = proxy.counts["requests"] - before["requests"]
        before = dict(proxy.counts)
        figures["list_1000_new_node_s"], out = timed(lambda: ev(env("d", url, proxy.url), "list", "--all"))
        figures["list_1000_new_node_requests"] = proxy.counts["requests"] - before["requests"]
        figures["list_1000_rows"] = len(out.strip().splitlines())
        before = dict(proxy.counts)
        figures["list_1000_again_same_node_s"], _ = timed(lambda: ev(env("d", url, proxy.url), "list", "--all"))
        figures["list_1000_again_requests"] = proxy.counts["requests"] - before["requests"]
        mirror = work / "mirror"
        ev(env("e", url), "sync", url, mirror)
        figures["anchor_list_1000_local_vault_s"], _ = timed(lambda: ev(env("m", str(mirror)), "list", "--all"))
        figures["ratio_push_to_anchor"] = round(figures["push_sync_s"] / figures["anchor_multipart_upload_s"], 2)
        figures["ratio_restore_to_anchor"] = round(figures["restore_into_empty_node_s"]
                                                   / figures["anchor_download_extract_s"], 2)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}, indent=1))
    finally:
        proxy.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

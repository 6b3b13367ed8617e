"""A real S3 server for the tests: moto's standalone server on 127.0.0.1, a free port, one per session.

The fixture ``s3_server`` (tests/conftest.py: one server for the whole session; each test makes its own
bucket) yields an :class:`S3Server` whose ``env()`` gives the AWS variables that point envvault at it, and ``bucket()`` makes a fresh bucket. Also a fault
proxy (``FaultProxy``) that stands between envvault and the server and returns 500s or cuts connections.
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path


__all__ = ["S3Server", "FaultProxy", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    KEY, SECRET, REGION = "testing-key", "testing-secret", "us-east-1"

    def __init__(self, log: Path, url: str | None = None):
        """A new moto server on a free port, or (``url``: ``http://127.0.0.1:PORT``) the one ``.ci/run``
        started, which is only waited for."""
        self.proc: subprocess.Popen | None = None
        self._log = None
        if url:
            self.url = url.rstrip("/")
            self.port = int(self.url.rsplit(":", 1)[1])
        else:
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self._log = open(log, "wb")
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                          str(self.port)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1).read()
                break
            except OSError:
                if (self.proc is not None and self.proc.poll() is not None) or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start (see {log})") from None
                time.sleep(0.1)

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": endpoint or self.url, "AWS_ACCESS_KEY_ID": self.KEY,
                "AWS_SECRET_ACCESS_KEY": self.SECRET, "AWS_REGION": self.REGION}

    def bucket(self, name: str | None = None) -> str:
        """Make a bucket (PUT /name, unsigned: moto accepts it) and return its name."""
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        req = urllib.request.Request(f"{self.url}/{name}", method="PUT")
        urllib.request.urlopen(req, timeout=30).read()
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        import obstore

        return sorted(m["path"] for batch in obstore.list(self._store(bucket), prefix or None) for m in batch)

    def delete(self, bucket: str, key: str) -> None:
        import obstore

        obstore.delete(self._store(bucket), key)

    def _store(self, bucket: str):
        from obstore.store import S3Store

        return S3Store(bucket, endpoint=self.url, region=self.REGION, access_key_id=self.KEY,
                       secret_access_key=self.SECRET, client_options={"allow_http": True},
                       virtual_hosted_style_request=False)

    def stop(self) -> None:
        if self.proc is None:  # .ci/run's server: .ci/run stops it
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._log is not None:
            self._log.close()


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` (host, port). While ``faults`` is on, each new
    connection, with probability ``rate``, gets an HTTP 500 (and is closed), or is cut after part of the
    request went through. ``counts`` says what it did."""

    def __init__(self, target_port: int, rate: float = 0.2, seed: int = 12):
        self.target = ("127.0.0.1", target_port)
        self.rate = rate
        self.faults = True
        self.forbid = False  # answer every request 403 InvalidAccessKeyId (a wrong credential)
        self.refuse: bytes | None = None  # cut any connection whose request holds these bytes (counts["refused"])
        self.rng = random.Random(seed)
        self.counts = {"connections": 0, "500": 0, "cut": 0, "refused": 0, "requests": 0, "bytes_down": 0}
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.counts["connections"] += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        roll = self.rng.random() if self.faults else 1.0
        try:
            if self.forbid:
                conn.recv(65536)
                body = (b"<Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key Id you provided does "
                        b"not exist in our records.</Message></Error>")
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                conn.close()
                return
            if roll < self.rate / 2:
                conn.recv(65536)
                self.counts["500"] += 1
                body = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\n"
                             b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                conn.close()
                return
            up = socket.create_connection(self.target)
        except OSError:
            conn.close()
            return
        cut_after = self.rng.randint(1, 200_000) if roll < self.rate else None
        if cut_after is not None:
            self.counts["cut"] += 1

        def pump(src: socket.socket, dst: socket.socket, budget: int | None, inspect: bool = False) -> None:
            sent = 0
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    if inspect:
                        self.counts["requests"] += data.count(b" HTTP/1.1\r\n")
                        if self.refuse is not None and self.refuse in data:
                            self.counts["refused"] += 1
                            break
                    else:
                        self.counts["bytes_down"] += len(data)
                    if budget is not None and sent + len(data) > budget:
                        dst.sendall(data[: max(budget - sent, 0)])
                        break
                    dst.sendall(data)
                    sent += len(data)
            except OSError:
                pass
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

        threading.Thread(target=pump, args=(conn, up, cut_after, True), daemon=True).start()
        pump(up, conn, None)

    def close(self) -> None:
        self._stop = True
        self.sock.close()

"""The job store: torch.distributed's TCPStore, hosted by the head node's ddpdoctor at the job's master address on
master_port + 1 (or $DDPDOCTOR_JOB_PORT), carrying each node's state envelope and the head's requests and verdict.

Every value is sealed with an HMAC of the per-job token (keys live under a namespace derived from it), so a foreign
client can neither read names it does not know nor forge values: what fails the check is dropped and counted."""

from __future__ import annotations

import datetime
import errno
import hashlib
import hmac
import json
import os
import secrets
import socket
import stat
import threading
import time
import zlib
from pathlib import Path
from typing import Any

TOKEN_ENV = "DDPDOCTOR_JOB_TOKEN"
PORT_ENV = "DDPDOCTOR_JOB_PORT"
TOKEN_FILE = ".job-token"
MAX_VALUE = 32 << 20  # bytes of one value, decompressed: 4,096 ranks' records are ~0.5 MiB
MAC_LEN = 32


class JobStoreError(Exception):
    """The store could not be hosted or reached."""


def job_port(master_port: int) -> int:
    """Where the head hosts the job store: $DDPDOCTOR_JOB_PORT, else the job's master port + 1."""
    env = os.environ.get(PORT_ENV, "")
    return int(env) if env.isdigit() and 0 < int(env) < 65536 else master_port + 1


def shared_token(run_root: Path, job_key: str, wait_s: float = 15.0) -> str:
    """The job's token: $DDPDOCTOR_JOB_TOKEN when set (the environment of the job's own processes: needed without a
    shared --out), else RUN/.job-token-<job>, created 0600 by the first node of the job that gets there and read by
    the others (the file name follows the job's identity, so another job's token is never reused). A token file is
    used only when it is a regular file (no link) that this user owns and nobody else can read: a file another user
    planted in a shared --out would let them read the store and forge the verdict, so it is refused (bad input)."""
    env = os.environ.get(TOKEN_ENV)
    if env:
        return env
    run_root.mkdir(parents=True, exist_ok=True)
    path = run_root / f"{TOKEN_FILE}-{hashlib.sha256(job_key.encode()).hexdigest()[:12]}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        deadline = time.time() + wait_s
        while time.time() < deadline:
            tok = _read_own_token(path)
            if len(tok) == 32:
                return tok
            time.sleep(0.1)
        raise JobStoreError(f"{path} holds no token; remove it or choose another --out") from None
    tok = secrets.token_hex(16)
    with os.fdopen(fd, "w") as f:
        f.write(tok)
    return tok


def _read_own_token(path: Path) -> str:
    """The token in ``path`` if this user created it (see shared_token); JobStoreError for a file it did not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JobStoreError(f"{path} is a symbolic link: refusing a job token another user could have "
                                "planted; remove it or set DDPDOCTOR_JOB_TOKEN") from None
        return ""
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise JobStoreError(
                f"{path} is not this user's private job token (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}): "
                "another user may have planted it; remove it, or set DDPDOCTOR_JOB_TOKEN on every node")
        return f.read(256).decode("ascii", "replace").strip()


class JobStore:
    """One node's handle on the job store (the head hosts it). Values: sealed, compressed JSON."""

    def __init__(self, host: str, port: int, token: str, is_head: bool, connect_timeout_s: float = 30.0) -> None:
        self.host, self.port, self.is_head = host, port, is_head
        self._key = hashlib.sha256(b"ddpdoctor-job-mac\0" + token.encode()).digest()
        self.ns = "ddpdoctor/" + hashlib.sha256(b"ddpdoctor-job-ns\0" + token.encode()).hexdigest()[:16] + "/"
        self.rejected = 0  # values that failed the seal or the size cap (junk, a foreign writer)
        self.requests = 0  # store operations made (the benchmark's request rate)
        self.bytes_out = 0
        self._store: Any = None
        self._listen: socket.socket | None = None
        self.bound: tuple[str, int] | None = None  # where the head listens
        self._lock = threading.Lock()
        timeout = datetime.timedelta(seconds=connect_timeout_s)
        import torch.distributed as dist

        try:
            if is_head:
                # Bound to the job's master address only (loopback for a one-host job), then handed to TCPStore.
                fam = socket.AF_INET6 if ":" in host else socket.AF_INET
                srv = socket.socket(fam, socket.SOCK_STREAM)
                srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                srv.bind((host, port))
                srv.listen(1024)
                self._listen = srv
                self._store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timeout,
                                            master_listen_fd=srv.fileno())
                self.bound = srv.getsockname()[:2]
                srv.detach()  # the store owns the descriptor now
                self._listen = None
            else:
                self._store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        except (OSError, RuntimeError) as exc:
            if self._listen is not None:
                self._listen.close()
            raise JobStoreError(f"job store at {host}:{port}: {exc}") from exc

    # -- sealing -------------------------------------------------------------------------------------
    def seal(self, name: str, obj: Any) -> bytes:
        body = zlib.compress(json.dumps(obj, separators=(",", ":"), default=str).encode(), 1)
        mac = hmac.new(self._key, name.encode() + b"\0" + body, hashlib.sha256).digest()
        return mac + body

    def unseal(self, name: str, value: bytes) -> Any:
        """The value, or None (counted in ``rejected``) when it is junk, forged, or too large."""
        mac, body = value[:MAC_LEN], value[MAC_LEN:]
        if len(value) <= MAC_LEN or not hmac.compare_digest(
                mac, hmac.new(self._key, name.encode() + b"\0" + body, hashlib.sha256).digest()):
            self.rejected += 1
            return None
        try:
            d = zlib.decompressobj()
            raw = d.decompress(body, MAX_VALUE)
            if d.unconsumed_tail:
                raise ValueError("too large")
            return json.loads(raw)
        except (ValueError, zlib.error, RecursionError):
            self.rejected += 1
            return None

    # -- operations ----------------------------------------------------------------------------------
    def put(self, name: str, obj: Any) -> int:
        """Set ``name`` (under the job's namespace); returns the bytes sent."""
        value = self.seal(name, obj)
        with self._lock:
            self.requests += 1
            self.bytes_out += len(value)
            self._store.set(self.ns + name, value)
        return len(value)

    def get(self, name: str) -> Any:
        """The value of ``name``, or None when absent or rejected (never blocks for a key that is not there)."""
        with self._lock:
            self.requests += 2
            if not self._store.check([self.ns + name]):
                return None
            value = self._store.get(self.ns + name)
        return self.unseal(name, bytes(value))

    # A boundary: raw JSON off the store (any node's value, of any version); every reader checks what it takes.
    def get_many(self, names: list[str]) -> dict[str, Any]:
        """Values of the names that exist (one multi_get for those seen before, a check for the others)."""
        out: dict[str, Any] = {}
        present: list[str] = []
        values: list[bytes] = []
        with self._lock:
            for n in names:
                self.requests += 1
                if self._store.check([self.ns + n]):
                    present.append(n)
            if present:
                self.requests += 1
                values = self._store.multi_get([self.ns + n for n in present])
        for n, v in zip(present, values, strict=True):
            obj = self.unseal(n, bytes(v))
            if obj is not None:
                out[n] = obj
        return out

    def delete(self, names: list[str]) -> None:
        """Remove ``names`` (values the head has taken: the store lives in the head's memory)."""
        with self._lock:
            for n in names:
                self.requests += 1
                self._store.delete_key(self.ns + n)

    def close(self) -> None:
        self._store = None

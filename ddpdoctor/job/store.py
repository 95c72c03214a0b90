"""The job store: torch.distributed's TCPStore, hosted by the head node's ddpdoctor at the job's master address on
master_port + 1 (or $DDPDOCTOR_JOB_PORT), carrying each node's state envelope and the head's requests and verdict.

TCPStore has no authentication: whoever reaches its port may list, read, write and delete keys. So what travels is
private by itself: each value is encrypted and authenticated with keys derived from the per-job token (which only the
job's own processes hold), and each key's name is a keyed hash, so a foreign client sees opaque names and bytes it
cannot read, change, move to another name or replay (a value older than one already read is refused). Sealing
(stdlib only, no AEAD there): a keystream of SHAKE-256 over (encryption key, 16 random bytes) XORed with the
compressed JSON, then HMAC-SHA256 over (name, nonce, ciphertext): encrypt-then-MAC. What it cannot stop is said in
docs/trust.md: deleting or overwriting keys (the readers then see a value missing or rejected, counted), a flood
of junk, and what sizes and timing tell."""

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
NONCE_LEN = 16
SEQ_LEN = 8
SEAL_VERSION = b"ddpdoctor-job-seal-2\0"


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
        self._mac_key, self._enc_key, self._name_key = (
            hashlib.sha256(b"ddpdoctor-job-" + what + b"\0" + token.encode()).digest()
            for what in (b"mac", b"enc", b"names"))
        self.ns = "ddpdoctor/" + hashlib.sha256(b"ddpdoctor-job-ns\0" + token.encode()).hexdigest()[:16] + "/"
        self.rejected = 0  # values that failed the seal or the size cap (junk, a foreign writer)
        self.stale = 0  # sealed values older than one already read under the same name (a replay)
        self._seen: dict[str, int] = {}  # name -> the newest sequence number read
        self.refused: dict[str, int] = {}  # name -> values refused under it (failed seal, replay, too large)
        self._seq = 0  # this writer's last sequence number (nanoseconds, strictly increasing)
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
    def key_of(self, name: str) -> str:
        """The store key of ``name``: a keyed hash, so listing the store's keys tells a foreign client nothing."""
        return self.ns + hmac.new(self._name_key, name.encode(), hashlib.sha256).hexdigest()[:32]

    def _mac(self, name: str, nonce: bytes, ct: bytes) -> bytes:
        return hmac.new(self._mac_key, SEAL_VERSION + name.encode() + b"\0" + nonce + ct, hashlib.sha256).digest()

    def _xor(self, nonce: bytes, data: bytes) -> bytes:
        stream = hashlib.shake_256(self._enc_key + nonce).digest(len(data))
        return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(len(data), "little")

    def seal(self, name: str, obj: Any) -> bytes:
        """MAC, nonce, then the ciphertext of (sequence number, compressed JSON)."""
        with self._lock:
            self._seq = max(self._seq + 1, time.time_ns())
            seq = self._seq
        body = seq.to_bytes(SEQ_LEN, "big") + zlib.compress(json.dumps(obj, separators=(",", ":"), default=str)
                                                            .encode(), 1)
        nonce = secrets.token_bytes(NONCE_LEN)
        ct = self._xor(nonce, body)
        return self._mac(name, nonce, ct) + nonce + ct

    def unseal(self, name: str, value: bytes) -> Any:
        """The value, or None when it is junk, forged, sealed for another name, too large (counted in ``rejected``)
        or older than one already read under this name (a replay: counted in ``stale``)."""
        mac, nonce, ct = value[:MAC_LEN], value[MAC_LEN:MAC_LEN + NONCE_LEN], value[MAC_LEN + NONCE_LEN:]
        if len(ct) <= SEQ_LEN or not hmac.compare_digest(mac, self._mac(name, nonce, ct)):
            self.rejected += 1
            self.refused[name] = self.refused.get(name, 0) + 1
            return None
        body = self._xor(nonce, ct)
        seq = int.from_bytes(body[:SEQ_LEN], "big")
        if seq < self._seen.get(name, 0):
            self.stale += 1
            self.refused[name] = self.refused.get(name, 0) + 1
            return None
        try:
            d = zlib.decompressobj()
            raw = d.decompress(body[SEQ_LEN:], MAX_VALUE)
            if d.unconsumed_tail:
                raise ValueError("too large")
            obj = json.loads(raw)
        except (ValueError, zlib.error, RecursionError):
            self.rejected += 1
            self.refused[name] = self.refused.get(name, 0) + 1
            return None
        self._seen[name] = seq
        return obj

    def tampered(self) -> str:
        """What a node's line adds when values were missing for a reason it can name: '' when none were refused."""
        if not (self.rejected or self.stale):
            return ""
        return (f"; {self.rejected} value(s) in the job store failed their seal and {self.stale} were replays: "
                "another client of the job store wrote into it")

    # -- operations ----------------------------------------------------------------------------------
    def put(self, name: str, obj: Any) -> int:
        """Set ``name`` (under the job's namespace); returns the bytes sent."""
        value = self.seal(name, obj)
        with self._lock:
            self.requests += 1
            self.bytes_out += len(value)
            self._store.set(self.key_of(name), value)
        return len(value)

    def get(self, name: str) -> Any:
        """The value of ``name``, or None when absent or rejected (never blocks for a key that is not there)."""
        with self._lock:
            self.requests += 2
            if not self._store.check([self.key_of(name)]):
                return None
            value = self._store.get(self.key_of(name))
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
                if self._store.check([self.key_of(n)]):
                    present.append(n)
            if present:
                self.requests += 1
                values = self._store.multi_get([self.key_of(n) for n in present])
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
                self._store.delete_key(self.key_of(n))

    def ring(self, name: str) -> None:
        """Push one bell on the queue ``name``: wakes a ``Bell`` blocked on it (its content means nothing: a foreign
        client's bell only costs the waiter a read)."""
        with self._lock:
            self.requests += 1
            self._store.queue_push(self.key_of(name), b"1")

    def bell(self, name: str) -> Bell:
        """A waiter on the queue ``name`` over a client connection of its own (its blocking pop never holds up
        this handle's requests)."""
        return Bell(self.host, self.port, self.key_of(name))

    def close(self) -> None:
        self._store = None


class Bell:
    """One blocking waiter on a job-store queue (TCPStore's queue_pop wakes the moment a value is pushed, ~0.3 ms
    here). It never times out: a pop that timed out would leave the server's answer to arrive on a connection that
    moved on, and each timeout logs a warning; ``stop`` ends it by ringing it. Every error ends ``wait`` with
    False (the head went away)."""

    def __init__(self, host: str, port: int, key: str) -> None:
        import torch.distributed as dist

        self.key = key
        self._store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(days=7))

    def wait(self) -> bool:
        try:
            self._store.queue_pop(self.key, block=True)
            return True
        except (RuntimeError, OSError, ValueError):
            return False

"""Disposable redis-server processes for the test suite.

The suite never touches a Redis it did not start: each server here runs on a
free loopback port with no persistence, so tests can kill, pause, restart and
flush it freely. The benchmark image runs it too, without pytest: pytest's
part (skipping without TLS) is in skips.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

# The command timeout of limiters whose tests check counts, not time limits: under a
# loaded CI machine a reply can take longer than the 0.5 s default, and a check that
# fails for being late is not what those tests are about. Tests of timeouts pass their own.
PATIENT_TIMEOUT_S = 10.0

INSTALL_HINT = (
    "redis-server was not found on PATH. The test suite starts its own Redis "
    "processes. Install it with `sudo apt-get install -y redis-server` (Debian/Ubuntu), "
    "`brew install redis` (macOS), or run `make test`, which installs it for you."
)


def redis_server_binary() -> str:
    path = os.environ.get("MODERATO_REDIS_SERVER") or shutil.which("redis-server")
    if not path:
        raise RuntimeError(INSTALL_HINT)
    return path


class Process(Protocol):
    """What ``running`` starts and closes: a RedisServer, a RedisCluster (tests/cluster.py)."""

    def start(self) -> object: ...

    def close(self) -> None: ...


P = TypeVar("P", bound=Process)


def running(process: P) -> Iterator[P]:
    """``process`` started, for a fixture to ``yield from``; closed after the test, and
    also when start() fails (a server that did start but never answered is not left)."""
    try:
        process.start()
        yield process
    finally:
        process.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and a server certificate it signed (for localhost and 127.0.0.1)."""

    directory: Path
    ca_file: Path
    cert_file: Path
    key_file: Path

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def server_args(self) -> tuple[str, ...]:
        return (
            "--tls-cert-file", str(self.cert_file),
            "--tls-key-file", str(self.key_file),
            "--tls-ca-cert-file", str(self.ca_file),
            # What a node presents when it connects to another (cluster bus,
            # replication): the server certificate is for serverAuth only.
            "--tls-client-cert-file", str(self.directory / "client.crt"),
            "--tls-client-key-file", str(self.directory / "client.key"),
            "--tls-auth-clients", "no",
        )  # fmt: skip


def make_tls_files(directory: Path) -> TlsFiles:
    """make_certificates() for localhost and 127.0.0.1, as a TlsFiles.

    RuntimeError if openssl is not installed (tests turn that into a skip).
    """
    try:
        make_certificates(directory, server_names="DNS:localhost,IP:127.0.0.1")
    except FileNotFoundError as error:
        raise RuntimeError(str(error)) from None
    return TlsFiles(
        directory, directory / "ca.crt", directory / "server.crt", directory / "server.key"
    )


class RedisServer:
    """One redis-server child process on 127.0.0.1:<port>.

    With ``tls`` it listens on <port> over TLS only (no plain-text port), and
    ping() and command() speak TLS too.
    """

    def __init__(
        self,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        tls: TlsFiles | None = None,
    ) -> None:
        self.port = port or free_port()
        self.extra_args = extra_args
        self.tls = tls
        self.dir = Path(tempfile.mkdtemp(prefix=f"moderato-redis-{self.port}-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://127.0.0.1:{self.port}"

    def _connect(self, timeout_s: float) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s)
        if self.tls is None:
            return sock
        return self.tls.client_context().wrap_socket(sock, server_hostname="127.0.0.1")

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        ports = ("--port", str(self.port))
        if self.tls is not None:
            ports = ("--port", "0", "--tls-port", str(self.port), *self.tls.server_args())
        args = [
            redis_server_binary(),
            *ports,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.dir / "redis.log"),
            "--protected-mode",
            "no",
            *self.extra_args,
        ]
        self._launch(args, "redis-server", timeout_s)
        return self

    def _launch(self, args: list[str], what: str, timeout_s: float) -> None:
        """Start ``args`` and wait until it answers PING (its log in the error if it dies)."""
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log_path = self.dir / "redis.log"
                log = log_path.read_text() if log_path.exists() else ""
                raise RuntimeError(f"{what} on port {self.port} exited on start:\n{log}")
            if self.ping():
                return
            time.sleep(0.02)
        raise RuntimeError(f"{what} on port {self.port} did not answer within {timeout_s} s")

    def ping(self) -> bool:
        try:
            with self._connect(0.5) as sock:
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:  # ssl.SSLError included
            return False

    def command(self, *args: str) -> bytes:
        """Run one command with a throwaway socket; returns the raw RESP reply."""
        payload = f"*{len(args)}\r\n".encode()
        for arg in args:
            data = arg.encode()
            payload += b"$%d\r\n%s\r\n" % (len(data), data)
        with self._connect(5) as sock:
            sock.sendall(payload)
            return sock.recv(1 << 16)

    def stop(self) -> None:
        """Kill the process (SIGKILL: an abrupt crash, no goodbye to clients)."""
        if self.process and self.process.poll() is None:
            self.resume()
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the socket stays open but nothing answers."""
        if self.process:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelServer(RedisServer):
    """One ``redis-server --sentinel`` process watching ``service`` on 127.0.0.1."""

    def __init__(
        self,
        primary_port: int,
        service: str = "moderato",
        down_after_ms: int = 400,
        failover_timeout_ms: int = 2000,
    ) -> None:
        super().__init__()
        self.service = service
        # A sentinel rewrites its configuration file, so it gets one of its own.
        self.config = self.dir / "sentinel.conf"
        self.config.write_text(
            f"sentinel monitor {service} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )

    def start(self, timeout_s: float = 10.0) -> SentinelServer:
        args = [
            redis_server_binary(),
            str(self.config),
            "--sentinel",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"),
            "--protected-mode", "no",
        ]  # fmt: skip
        self._launch(args, "sentinel", timeout_s)
        return self

    def primary_port(self) -> int | None:
        """The port of the primary this sentinel names now (None if it names none)."""
        reply = self.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        parts = reply.split(b"\r\n")
        return int(parts[4]) if reply.startswith(b"*2") else None

    def knows(self, replicas: int, other_sentinels: int) -> bool:
        """Whether this sentinel has found that many replicas and other sentinels."""
        found_replicas = self.command("SENTINEL", "REPLICAS", self.service)
        found_sentinels = self.command("SENTINEL", "SENTINELS", self.service)
        return found_replicas.startswith(b"*%d\r\n" % replicas) and found_sentinels.startswith(
            b"*%d\r\n" % other_sentinels
        )


class SentinelDeployment:
    """A primary, one replica and three sentinels on free loopback ports."""

    def __init__(self, service: str = "moderato", down_after_ms: int = 400) -> None:
        self.service = service
        self.primary = RedisServer().start()
        self.replica = RedisServer(
            extra_args=("--replicaof", "127.0.0.1", str(self.primary.port))
        ).start()
        self.sentinels = [
            SentinelServer(self.primary.port, service, down_after_ms).start() for _ in range(3)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    def wait_until_watched(self, timeout_s: float = 20.0) -> None:
        """Block until the replica is in sync and every sentinel knows the whole deployment."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            synced = b"master_link_status:up" in self.replica.command("INFO", "replication")
            if synced and all(sentinel.knows(1, 2) for sentinel in self.sentinels):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the sentinels did not discover the deployment within {timeout_s} s")

    def close(self) -> None:
        for server in (*self.sentinels, self.replica, self.primary):
            server.close()


def make_certificates(directory: Path, server_names: str = "DNS:localhost") -> None:
    """A throwaway CA (ca.crt), a server certificate for ``server_names`` (server.crt,
    server.key) and a client certificate (client.crt, client.key), all in ``directory``.

    Raises FileNotFoundError when openssl is not installed.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("openssl is not installed; cannot make test certificates")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *curve, "-days", "2", "-subj", "/CN=moderato test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        run("req", *curve, "-subj", f"/CN=moderato {name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        extensions = directory / f"{name}.cnf"
        extensions.write_text(
            (f"subjectAltName={server_names}\n" if name == "server" else "")
            + "keyUsage=critical,digitalSignature\n"
            + f"extendedKeyUsage={usage}\n"
            + "authorityKeyIdentifier=keyid,issuer\n"
        )
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", str(extensions),
            "-out", f"{name}.crt")  # fmt: skip

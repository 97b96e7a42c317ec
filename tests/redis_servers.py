"""Disposable redis-server processes for the test suite.

The suite never touches a Redis it did not start: each server here runs on a
free loopback port with no persistence, so tests can kill, pause, restart and
flush it freely.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server child process on 127.0.0.1:<port>."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.extra_args = extra_args
        self.dir = Path(tempfile.mkdtemp(prefix=f"moderato-redis-{self.port}-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        args = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"),
            "--protected-mode", "no",
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log_path = self.dir / "redis.log"
                log = log_path.read_text() if log_path.exists() else ""
                raise RuntimeError(f"redis-server on port {self.port} exited on start:\n{log}")
            if self.ping():
                return self
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout_s} s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *args: str) -> bytes:
        """Run one command with a throwaway socket; returns the raw RESP reply."""
        payload = f"*{len(args)}\r\n".encode()
        for arg in args:
            data = arg.encode()
            payload += b"$%d\r\n%s\r\n" % (len(data), data)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
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

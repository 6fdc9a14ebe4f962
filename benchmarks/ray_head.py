"""A private Ray head for a benchmark: what ``ray start --head`` gives a user, and its CPU time.

The head runs under ``ray start --block`` in a session of its own with its own temp
directory, so a test's ``ray.init()`` elsewhere on the machine does not join it and
ending it (SIGTERM to that session) stops only its processes, where ``ray stop``
would stop every Ray process of the machine. A run joins it through ``RAY_ADDRESS``
(the shipped config's ``address: auto`` reads it) and the token in ``env``.

    with private_ray_head() as head:
        subprocess.run([...], env={**os.environ, **head.env})
        print(head.cpu_seconds())  # gcs_server, raylet, the buffer actor, ... so far
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass
class RayHead:
    """A running head: where it is, what a process needs to join it, its processes."""

    address: str
    env: dict[str, str]
    process: subprocess.Popen[bytes]

    def cpu_seconds(self) -> float:
        """User + system CPU of the head's processes, with the workers they reaped."""
        total = 0.0
        try:
            root = psutil.Process(self.process.pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):  # a process that ended since
                    t = proc.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
        return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def private_ray_head(num_cpus: int = 2, timeout: float = 120.0) -> Iterator[RayHead]:
    """Start a head (``ray start --head --block``), yield it once it answers, stop it."""
    temp = Path(tempfile.mkdtemp(prefix="rb_ray_"))
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    ray = str(Path(sys.executable).with_name("ray"))
    command = [
        ray, "start", "--head", "--block", "--num-cpus", str(num_cpus),
        "--port", str(_free_port()), "--node-ip-address", "127.0.0.1",
        "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(temp),
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        address_file = temp / "ray_current_cluster"
        deadline = time.monotonic() + timeout
        while not address_file.exists() or not address_file.read_text().strip():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start --head did not come up: {' '.join(command)}")
            time.sleep(0.2)
        address = address_file.read_text().strip()
        yield RayHead(address, {**env, "RAY_ADDRESS": address}, process)
    finally:
        for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            if process.poll() is not None:
                break
            os.killpg(process.pid, sig)
            try:
                process.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        shutil.rmtree(temp, ignore_errors=True)

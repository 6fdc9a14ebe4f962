"""Ray nodes started with ``ray start`` on this machine, each stoppable on its own.

``ray stop`` stops every Ray process of the machine (another test's too), so each node
here is one ``ray start --block`` process in a session of its own, with its own ports
(free ones, picked when it starts) and ``--temp-dir``; :meth:`RayNode.kill` sends SIGKILL
to that process and everything under it (GCS, raylet, its agents and worker processes),
as a machine that goes away would. Token authentication (``RAY_AUTH_MODE=token``) with a
token made for the cluster, passed in ``RAY_AUTH_TOKEN`` to every process that joins.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

START_TIMEOUT_S = 60
READY = "will now block"
# The `ray` command of this interpreter's environment.
RAY = str(Path(sys.executable).with_name("ray"))


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on 127.0.0.1 right now (all bound at once: no repeats)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cluster_env(address: str | None, token: str, pythonpath: str) -> dict[str, str]:
    """The environment of every process of the cluster: its address and token."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    env["PYTHONPATH"] = pythonpath
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # The head declares a node dead after 3 missed health checks 0.5 s apart (Ray's
    # default takes ~30 s), so a test sees a killed node as dead within seconds.
    env["RAY_health_check_period_ms"] = "500"
    env["RAY_health_check_failure_threshold"] = "3"
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    if address is not None:
        env["RAY_ADDRESS"] = address
    return env


class RayNode:
    """One ``ray start --block`` node; ``resources`` makes it the place for some actors."""

    def __init__(
        self, resources: dict[str, float], env: dict[str, str], head_address: str | None = None
    ) -> None:
        # A short path: Ray's Unix sockets live under it (108 characters at most).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rbnode", dir="/tmp"))
        ports = free_ports(10)
        self.port = ports[0]
        command = [RAY, "start", "--block", "--node-ip-address", "127.0.0.1"]
        if head_address is None:
            command += ["--head", "--port", str(ports[0]), "--include-dashboard", "false"]
            command += ["--dashboard-port", str(ports[8])]
            command += ["--ray-client-server-port", str(ports[9])]
        else:
            command += ["--address", head_address]
        command += [
            *("--node-manager-port", str(ports[1]), "--object-manager-port", str(ports[2])),
            *("--dashboard-agent-listen-port", str(ports[3])),
            *("--dashboard-agent-grpc-port", str(ports[4])),
            *("--runtime-env-agent-port", str(ports[5])),
            *("--metrics-export-port", str(ports[6])),
            *("--min-worker-port", "0", "--max-worker-port", "0"),  # any free port
            *("--num-cpus", "1", "--resources", json.dumps(resources)),
            *("--temp-dir", str(self.temp_dir), "--disable-usage-stats"),
        ]
        self.command = command
        self.log = self.temp_dir / "ray_start.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while READY not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                output = self.log.read_text()[-3000:]
                self.kill()
                shutil.rmtree(self.temp_dir, ignore_errors=True)
                raise RuntimeError(f"ray start did not come up: {' '.join(command)}\n{output}")
            time.sleep(0.2)

    def processes(self) -> list[psutil.Process]:
        """``ray start`` and every process under it (GCS, raylet, agents, workers)."""
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def pids(self) -> set[int]:
        return {process.pid for process in self.processes()}

    def kill(self) -> None:
        """SIGKILL this node's processes, all at once; leave the other nodes running."""
        processes = self.processes()
        for process in processes:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(processes, timeout=30)
        self.process.wait(timeout=30)


class TwoNodeCluster:
    """A head node holding ``{head_resource: 8}`` and a second node holding ``{other: 8}``.

    An actor that asks for one unit of a node's resource can only be placed there; 8 units
    leave room for several such actors (one per buffer shard) on one node.
    """

    def __init__(self, head_resource: str, other_resource: str, pythonpath: str) -> None:
        self.token = secrets.token_hex(32)
        self.nodes: list[RayNode] = []
        try:
            base = cluster_env(None, self.token, pythonpath)
            self.head = RayNode({head_resource: 8}, base)
            self.nodes.append(self.head)
            self.address = f"127.0.0.1:{self.head.port}"
            self.env = cluster_env(self.address, self.token, pythonpath)
            self.other = RayNode({other_resource: 8}, self.env, head_address=self.address)
            self.nodes.append(self.other)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill every node's processes (the second node first) and remove their temp dirs."""
        for node in reversed(self.nodes):
            node.kill()
            shutil.rmtree(node.temp_dir, ignore_errors=True)

"""The local Ray cluster of the Ray tests in this folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cluster():
    """One local Ray instance on loopback for a test module (starting Ray takes seconds on 2
    cores); yields its GCS address for the scripts a test starts."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()

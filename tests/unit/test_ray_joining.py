"""Joining a cluster that `ray start` made: its token is sent, and a refusal is one paragraph.

The run through train.py against a real `ray start` head is
tests/scale/test_scale_ray.py::test_the_ray_config_joins_a_ray_start_cluster_as_typed.
"""

from __future__ import annotations

import os

import pytest

from rb_lightning.runs.config_errors import RAY_TOKEN_NEEDED, instantiation_error
from rb_lightning.runs.startup import send_ray_start_token


@pytest.mark.parametrize(
    ("env", "token_file", "mode"),
    [
        ({}, True, "token"),  # what `ray start` leaves: a token file, no mode
        ({"RAY_AUTH_TOKEN": "t"}, False, "token"),
        ({}, False, None),  # no token anywhere: Ray's own default
        ({"RAY_AUTH_MODE": "disabled"}, True, "disabled"),  # the user's word stands
    ],
)
def test_the_token_is_sent_where_one_is_at_hand(monkeypatch, tmp_path, env, token_file, mode):
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    if token_file:
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text("t")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    send_ray_start_token()

    assert os.environ.get("RAY_AUTH_MODE") == mode


def test_a_refused_token_is_one_paragraph_without_rays_traceback():
    refused = RuntimeError(
        "Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
        '  File "x.py", line 1\nray.exceptions.AuthenticationError: RPC error: '
        "InvalidAuthToken: Authentication token is missing or incorrect."
    )
    error = instantiation_error(refused, {})
    assert str(error).endswith(RAY_TOKEN_NEEDED) and "Traceback" not in str(error)
    assert "RAY_AUTH_MODE=token" in RAY_TOKEN_NEEDED

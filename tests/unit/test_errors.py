"""rb_lightning.errors: UsageError names the argument and is a ValueError."""

from __future__ import annotations

import pytest

from rb_lightning.errors import UsageError


def test_usage_error_carries_argument_and_message():
    with pytest.raises(ValueError, match="set max_steps") as info:
        raise UsageError("num_batches", "num_batches=None needs a bound: set max_steps.")
    assert info.value.argument == "num_batches"

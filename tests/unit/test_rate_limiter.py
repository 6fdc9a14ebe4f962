"""SamplesPerInsert: Reverb's semantics, counted in items, and its errors."""

from __future__ import annotations

import threading

import pytest

from rb_lightning.errors import SampleTimeoutError, UsageError
from rb_lightning.stream.rate_limiter import SamplesPerInsert


def test_nothing_is_sampled_before_min_size_then_the_window_holds():
    limiter = SamplesPerInsert(samples_per_insert=2.0, min_size=10, error_buffer=8)
    limiter.record_insert(9)
    assert not limiter.can_sample(1)
    limiter.record_insert(1)  # min_size reached: target 0, window +-4
    assert limiter.can_sample(4) and not limiter.can_sample(5)
    limiter.record_insert(3)  # target 6
    assert limiter.can_sample(10) and not limiter.can_sample(11)
    assert limiter.inserts_needed(11) == 1
    limiter.record_sample(10)
    # the collector may run at most error_buffer / 2 samples ahead of the trainer: 14
    assert limiter.can_insert(4) and not limiter.can_insert(5)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"samples_per_insert": 0}, "samples_per_insert"),
        ({"samples_per_insert": -1.0}, "samples_per_insert"),
        ({"samples_per_insert": 4.0, "error_buffer": 7}, "error_buffer"),
        ({"error_buffer": 1}, "error_buffer"),
        ({"min_size": 0}, "min_size"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(UsageError) as err:
        SamplesPerInsert(**kwargs)
    assert err.value.argument == argument


def test_setup_checks_the_window_against_the_batch_and_min_size_against_the_capacity():
    with pytest.raises(UsageError, match="smaller than a batch"):
        SamplesPerInsert(error_buffer=16).check(batch_size=32, capacity=None)
    with pytest.raises(UsageError, match="more than the replay buffer holds"):
        SamplesPerInsert(min_size=2_000).check(batch_size=32, capacity=1_000)
    limiter = SamplesPerInsert(samples_per_insert=4.0)
    limiter.check(batch_size=32, capacity=1_000)
    assert limiter.error_buffer == 64  # two batches by default


def test_a_side_that_waits_past_the_timeout_stops_naming_the_stalled_side():
    limiter = SamplesPerInsert(min_size=4, timeout=0.2)
    limiter.check(batch_size=2, capacity=None)
    with pytest.raises(SampleTimeoutError, match="trainer waited 0.2s for the collector"):
        limiter.acquire_sample(2)
    limiter.record_insert(8)  # 4 samples due, window +-2: the collector may not run on
    with pytest.raises(SampleTimeoutError, match="collector waited 0.2s for the trainer"):
        limiter.acquire_insert(4)


def test_an_on_demand_collector_is_asked_for_exactly_what_the_trainer_needs():
    limiter = SamplesPerInsert(samples_per_insert=4.0, min_size=8)
    limiter.check(batch_size=16, capacity=None)
    calls = []

    def collect() -> int:
        calls.append(limiter.inserted)
        limiter.record_insert(4)
        return 4

    limiter.insert_on_demand(collect)
    for _ in range(10):
        limiter.acquire_sample(16)
    assert limiter.sampled == 160
    # the ratio stays within the window all along: |sampled - target| <= error_buffer / 2
    assert abs(limiter.sampled - (limiter.inserted - 8) * 4.0) <= 16
    assert calls[0] == 0  # nothing inserted before the first batch was asked for


def test_two_threads_keep_the_ratio_within_the_error_buffer():
    limiter = SamplesPerInsert(samples_per_insert=2.0, min_size=20, error_buffer=40, timeout=10)
    limiter.check(batch_size=8, capacity=None)
    worst = [0.0]

    def insert() -> None:
        for _ in range(500):  # (500 - min_size) * 2 = 960: what the trainer samples
            limiter.acquire_insert(1)

    writer = threading.Thread(target=insert)
    writer.start()
    for _ in range(120):
        limiter.acquire_sample(8)
        worst[0] = max(worst[0], abs(limiter.sampled - (limiter.inserted - 20) * 2.0))
    writer.join(timeout=10)
    assert limiter.sampled == 960
    assert worst[0] <= 40 / 2 + 8  # within the window, give or take the batch in flight

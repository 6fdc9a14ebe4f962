"""Find a Ray-backed replay buffer from any process of a Ray cluster (needs the ``ray`` extra).

torchrl runs a shared buffer as a Ray actor: ``ReplayBuffer(service_backend="ray")``
returns a :class:`~torchrl.data.RayReplayBuffer` that owns the actor. Give the
actor a name (``remote_config={"name": ..., "namespace": ...}``) and every
other process of the cluster (collectors, DDP ranks on other machines) can
reach it with :class:`RayReplayBufferView`, a non-owning view
usable wherever a ``ReplayBuffer`` is expected, e.g. by
:class:`~rb_lightning.ReplayBufferDataModule`.

``import rb_lightning`` does not import this module.

Example (one process serves, another connects; here both are this process)::

    import ray
    import torch
    from functools import partial
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from rb_lightning.distributed.ray import RayReplayBufferView, named_actor_config

    ray.init(num_cpus=1, include_dashboard=False)
    owner = ReplayBuffer(
        storage=partial(LazyTensorStorage, 1_000),  # constructors, built inside the actor
        service_backend="ray",
        service_backend_options={"remote_config": named_actor_config("replay")},
    )
    view = RayReplayBufferView("replay")  # elsewhere: RayReplayBufferView("replay", address=...)
    view.extend(TensorDict({"x": torch.arange(8)}, batch_size=[8]))
    assert len(owner) == 8
    owner.close()  # kills the actor; view.close() would only drop the reference
"""

from __future__ import annotations

import os
import time
from typing import Any

from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

from rb_lightning.buffers.priorities import (
    InvalidPriority,
    check_invalid_priority_mode,
    check_priority,
    current_max_priority,
)
from rb_lightning.distributed.actor_process import semaphore_names_released
from rb_lightning.errors import SampleTimeoutError, UsageError
from rb_lightning.stream.remote_prefetch import (
    DEFAULT_BATCHES_PER_REQUEST,
    DEFAULT_REQUESTS_IN_FLIGHT,
    live_actor,
)
from rb_lightning.torchrl_compat import bind_ray_actor, unbind_ray_actor
from rb_lightning.validation import check_positive_int

#: Ray namespace used when none is given, so owners and clients agree by default.
DEFAULT_NAMESPACE = "rb_lightning"


def named_actor_config(
    name: str, *, namespace: str = DEFAULT_NAMESPACE, num_cpus: float = 0, **options: Any
) -> dict[str, Any]:
    """``remote_config`` for ``ReplayBuffer(service_backend="ray")`` that names the actor.

    Args:
        name: Name under which :class:`RayReplayBufferView` finds the buffer.

    Keyword Args:
        namespace: Ray namespace of the name.
        num_cpus: CPUs Ray reserves for the buffer actor. ``0`` (default) lets it
            share a node with collectors and trainers; sampling is cheap.
        **options: Other ``ray.remote`` actor options (``num_gpus``, ``memory``,
            ``resources`` to pin the actor to a node, ...).

    Examples:
        >>> named_actor_config("replay")
        {'num_cpus': 0, 'name': 'replay', 'namespace': 'rb_lightning'}
    """
    if not isinstance(name, str) or not name:
        raise UsageError("name", f"name must be a non-empty string, got {name!r}.")
    return {"num_cpus": num_cpus, **options, "name": name, "namespace": namespace}


class RayReplayBufferView(RayReplayBuffer):
    """A torchrl ``RayReplayBuffer`` bound to a named actor that another process owns.

    Connects to the buffer actor named ``name`` (waiting for it to appear) and
    behaves like its owner: ``sample``, ``extend``, ``update_priority`` and
    ``len`` go to the shared actor, so every rank and collector sees the same
    content, sampler and priorities. It does not own the actor: :meth:`close`
    only drops the reference; the actor lives as long as its owner.

    Args:
        name: The actor name given to the owner through :func:`named_actor_config`.

    Keyword Args:
        namespace: Ray namespace of the name.
        address: Ray cluster to join when this process is not connected yet
            (``"HEAD_IP:6379"``, or ``"auto"`` on a node started with ``ray start``).
            Ignored when Ray is already initialised in this process.
        timeout: Seconds to wait for the owner to create the actor (it may start
            later than this process).
        ray_init_config: Other ``ray.init`` keyword arguments, used with ``address``.
        invalid_priority: What :meth:`update_priority` does with NaN, infinite or
            negative priorities, which would poison the shared sampler for every
            rank: ``"raise"`` (default) or ``"replace"`` (with ``1.0``: the
            actor's max priority is not read back), logging how many.
        requests_in_flight: Sample calls a :class:`~rb_lightning.ReplayBufferDataModule`
            keeps queued at the actor, so the next batch is drawn while the step
            runs (``1``: one round trip per batch; default
            :data:`~rb_lightning.stream.remote_prefetch.DEFAULT_REQUESTS_IN_FLIGHT`).
        batches_per_request: Batches each of those calls draws, as one sample of
            ``batches_per_request * batch_size`` items split in this process (only
            for samplers that draw each item on its own: ``RandomSampler``,
            ``PrioritizedSampler``; others draw one batch per call). Default
            :data:`~rb_lightning.stream.remote_prefetch.DEFAULT_BATCHES_PER_REQUEST`;
            see docs/scaling.md.
    """

    def __init__(
        self,
        name: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        address: str | None = None,
        timeout: float = 60.0,
        ray_init_config: dict[str, Any] | None = None,
        invalid_priority: InvalidPriority = "raise",
        requests_in_flight: int = DEFAULT_REQUESTS_IN_FLIGHT,
        batches_per_request: int = DEFAULT_BATCHES_PER_REQUEST,
    ) -> None:
        self.requests_in_flight = check_positive_int(requests_in_flight, "requests_in_flight")
        self.batches_per_request = check_positive_int(batches_per_request, "batches_per_request")
        # Not RayReplayBuffer.__init__, which would start a new actor: bind the named one,
        # through the same client torchrl's RayReplayBuffer.client() hands out.
        actor = _find_actor(name, namespace, address, timeout, ray_init_config or {})
        self.name, self.namespace = name, namespace
        self.invalid_priority = check_invalid_priority_mode(invalid_priority)
        bind_ray_actor(self, actor)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Send new priorities to the shared sampler, refusing NaN, inf and negative ones.

        See :func:`rb_lightning.buffers.priorities.check_priority`.
        """
        priority = check_priority(
            priority,
            invalid=self.invalid_priority,
            replacement=lambda: current_max_priority(self),
            where="RayReplayBufferView.update_priority",
        )
        super().update_priority(index, priority)

    def close(self) -> None:
        """Drop the reference to the actor; the owner keeps it alive."""
        unbind_ray_actor(self)

    def __repr__(self) -> str:
        state = "connected" if self.is_alive else "closed"
        return f"{type(self).__name__}(name={self.name!r}, namespace={self.namespace!r}, {state})"


def _find_actor(
    name: str, namespace: str, address: str | None, timeout: float, init: dict[str, Any]
) -> Any:
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            'RayReplayBufferView needs Ray: pip install "rb-lightning[ray]".'
        ) from err
    if not ray.is_initialized():
        ray.init(address=address, **init)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get_actor(name, namespace=namespace)
        except ValueError:  # Ray's "failed to look up actor"
            if time.monotonic() > deadline:
                raise SampleTimeoutError(
                    f"No Ray replay buffer named {name!r} in namespace {namespace!r} appeared "
                    f"within {timeout:.0f}s on the cluster at "
                    f"{ray.get_runtime_context().gcs_address}. Start its owner on that cluster "
                    "with ReplayBuffer(..., service_backend='ray', service_backend_options="
                    f"{{'remote_config': named_actor_config({name!r})}}), or check name, "
                    "namespace and address."
                ) from None
            time.sleep(0.2)


# -- the actor's process --------------------------------------------------------------------


def release_semaphore_names(replay_buffer: RayReplayBuffer) -> int:
    """Have the buffer's actor remove its semaphore names from ``/dev/shm`` (how many it did).

    A torchrl buffer in a Ray actor holds five ``multiprocessing`` values, each a named
    semaphore (torchrl sets the spawn start method), and Ray ends actors without the
    finalizers that would remove the names: each actor left five ``/dev/shm/sem.mp-*``
    entries for good. The actor needs no names (it shares its semaphores with no other
    process): see :mod:`rb_lightning.distributed.actor_process`. A
    :class:`~rb_lightning.ReplayBufferDataModule` calls this in ``setup``; call it
    yourself for a Ray buffer built outside one (a collector script's own owner).
    """
    import ray

    actor = live_actor(replay_buffer)
    return int(ray.get(actor.__ray_call__.remote(semaphore_names_released())))


def where_it_runs(replay_buffer: RayReplayBuffer) -> str:
    """One line for a run's output: ``Ray cluster at <address>: buffer actor <name>``."""
    import ray

    def actor_name(_: Any) -> str | None:
        return ray.get_runtime_context().get_actor_name()

    name = ray.get(live_actor(replay_buffer).__ray_call__.remote(actor_name))
    address = ray.get_runtime_context().gcs_address
    return f"Ray cluster at {address}: buffer actor {name or '(unnamed)'}"


# -- checkpointing (rb_lightning.checkpoint) --------------------------------------------------
# These run inside the buffer actor through Ray's ``__ray_call__``, so each is one actor
# call: a collector's writes land before or after it, never in the middle. They are
# nested functions on purpose: cloudpickle sends them by value, so the actor's process
# needs torchrl only, not rb_lightning.


def remote_build(replay_buffer: RayReplayBuffer, sampler_attributes: list[str]) -> dict[str, Any]:
    """Storage, sampler and writer of the actor's buffer: class names, capacity, settings."""
    import ray

    def describe(rb: Any, attributes: list[str]) -> dict[str, Any]:
        sampler = rb.sampler
        values = {name: getattr(sampler, name, None) for name in attributes}
        return {
            "storage": type(rb.storage).__name__,
            "capacity": int(rb.storage.max_size),
            "sampler": type(sampler).__name__,
            "sampler_attributes": {
                k: v for k, v in values.items() if isinstance(v, (bool, int, float))
            },
            "writer": type(rb.writer).__name__,
        }

    return ray.get(live_actor(replay_buffer).__ray_call__.remote(describe, sampler_attributes))


def dump_in_actor(replay_buffer: RayReplayBuffer, path: str) -> tuple[int, int]:
    """The actor writes its buffer with torchrl's ``dumps`` to ``path`` (a path it can reach).

    Returns the item count and ``write_count`` of what was written. An empty buffer
    (torchrl cannot dump a storage that never held data) only creates ``path``.
    """
    import ray

    def dump(rb: Any, target: str) -> tuple[int, int]:
        if len(rb) == 0:
            os.makedirs(target)
        else:
            rb.dumps(target)
        return len(rb), int(rb.write_count)

    return ray.get(live_actor(replay_buffer).__ray_call__.remote(dump, path))


def load_in_actor(replay_buffer: RayReplayBuffer, path: str | None) -> tuple[int, int]:
    """The actor replaces its content with torchrl's ``loads(path)`` (``None``: empties it).

    Returns the item count and ``write_count`` right after, in the same actor call.
    """
    import ray

    def load(rb: Any, source: str | None) -> tuple[int, int]:
        if source is None:
            rb.empty()
        else:
            rb.loads(source)
        return len(rb), int(rb.write_count)

    return ray.get(live_actor(replay_buffer).__ray_call__.remote(load, path))


__all__ = [
    "DEFAULT_NAMESPACE",
    "RayReplayBufferView",
    "dump_in_actor",
    "load_in_actor",
    "named_actor_config",
    "release_semaphore_names",
    "remote_build",
    "where_it_runs",
]

"""How a replay buffer is built, as recorded in a dump, and the check that a resumed one matches.

A resumed run with another sampler or writer would silently drop state (a
``PrioritizedSampler``'s priorities) or draw another stream, so every dump
records its buffer's build (:func:`buffer_build`) and a load into a buffer
built differently is refused (:func:`check_same_build`), naming each difference.

Examples:
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> build = buffer_build(ReplayBuffer(storage=LazyTensorStorage(8)))
    >>> build["storage"], build["capacity"], build["sampler"], build["writer"]
    ('LazyTensorStorage', 8, 'RandomSampler', 'RoundRobinWriter')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchrl.data import ReplayBuffer

from rb_lightning import torchrl_compat
from rb_lightning.errors import BufferCheckpointError

__all__ = [
    "SAME_BUILD_HINT",
    "build_record",
    "buffer_build",
    "check_same_build",
    "compare_builds",
]

#: Sampler settings recorded (a reader rebuilds the sampler with them) but not compared on
#: resume: how many policy versions old a drawn group may be, and which groups come first, are
#: settings of the run, which a resumed run may change; the stored items do not depend on them.
_RUN_SETTINGS = frozenset({"max_staleness", "order"})

#: What to say when loading failed although the builds matched.
SAME_BUILD_HINT = (
    "The buffer is built as the saved one (storage type, max_size, sampler and its "
    "settings, writer: all match), so the build is not the cause. Resume from an earlier "
    "checkpoint; if that fails the same way, report it with this message."
)


def build_record(parts: dict[str, Any], sampler_attributes: dict[str, Any]) -> dict[str, Any]:
    """A build record from its class names and capacity (``parts``) and the sampler's attributes.

    ``sampler_attributes``: the values of ``torchrl_compat.SAMPLER_SETTINGS``' attributes,
    wherever they were read (in this process, or inside a Ray buffer's actor); those
    that are numbers, booleans or strings are recorded as the sampler's settings.
    """
    settings = {
        name: sampler_attributes[attribute]
        for attribute, name in torchrl_compat.SAMPLER_SETTINGS.items()
        if isinstance(sampler_attributes.get(attribute), (bool, int, float, str))
    }
    return {**parts, "sampler_settings": settings}


def buffer_build(replay_buffer: ReplayBuffer) -> dict[str, Any]:
    """How ``replay_buffer`` is built, as far as it shapes the sampled stream (JSON-able).

    Storage, sampler and writer classes, the capacity and the sampler's settings
    (``alpha``, ``beta``, ``eps``, ``max_capacity`` of a ``PrioritizedSampler``;
    ``drop_last``, ``shuffle`` of a ``SamplerWithoutReplacement``). Recorded in
    every dump's manifest and compared on load by :func:`check_same_build`. A
    Ray buffer's is read inside its actor (:mod:`rb_lightning.distributed.ray_checkpoint`).
    """
    sampler = replay_buffer.sampler
    parts = {
        "storage": type(replay_buffer.storage).__name__,
        "capacity": int(replay_buffer.storage.max_size),
        "sampler": type(sampler).__name__,
        # Where the reader finds a sampler that is not torchrl's (GroupSampler).
        "sampler_module": type(sampler).__module__,
        "writer": type(replay_buffer.writer).__name__,
    }
    attributes = {
        attribute: getattr(sampler, attribute, None)
        for attribute in torchrl_compat.SAMPLER_SETTINGS
    }
    return build_record(parts, attributes)


def check_same_build(saved: dict[str, Any], replay_buffer: ReplayBuffer, root: Path) -> None:
    """Raise :class:`BufferCheckpointError` when ``replay_buffer`` is built unlike ``saved``.

    ``saved``: the build recorded in the manifest of the dump in ``root``.
    """
    compare_builds(saved, buffer_build(replay_buffer), root)


def compare_builds(saved: dict[str, Any], given: dict[str, Any], root: Path) -> None:
    """Raise :class:`BufferCheckpointError` naming each difference between two build records.

    Examples:
        >>> saved = {"storage": "LazyTensorStorage", "capacity": 8, "sampler": "RandomSampler",
        ...          "writer": "RoundRobinWriter", "sampler_settings": {}}
        >>> compare_builds(saved, {**saved, "capacity": 16}, Path("dump"))
        Traceback (most recent call last):
        ...
        rb_lightning.errors.BufferCheckpointError: The replay buffer saved in dump was built differently from the one it is being restored into (saved max_size=8, given max_size=16). Resuming would drop the saved sampler or writer state or change the sampled stream. Build the replay buffer with the saved storage, capacity, sampler (and its settings) and writer, or start a new run instead of resuming this checkpoint.
    """
    differences = []
    for part in ("storage", "capacity", "sampler", "writer"):
        if saved.get(part) != given[part]:
            name = "max_size" if part == "capacity" else part
            differences.append(f"saved {name}={saved.get(part)}, given {name}={given[part]}")
    if saved.get("sampler") == given["sampler"]:
        for name, value in saved.get("sampler_settings", {}).items():
            if name not in _RUN_SETTINGS and given["sampler_settings"].get(name) != value:
                differences.append(
                    f"saved {given['sampler']}({name}={value}), given "
                    f"{given['sampler']}({name}={given['sampler_settings'].get(name)})"
                )
    if differences:
        raise BufferCheckpointError(
            f"The replay buffer saved in {root} was built differently from the one it is "
            f"being restored into ({'; '.join(differences)}). Resuming would drop the saved "
            "sampler or writer state or change the sampled stream. Build the replay buffer "
            "with the saved storage, capacity, sampler (and its settings) and writer, or "
            "start a new run instead of resuming this checkpoint."
        )

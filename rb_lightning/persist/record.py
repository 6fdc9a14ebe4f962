"""The one record of a saved buffer's state: what a checkpoint holds for its buffer, by kind.

A DataModule's checkpoint stores a :class:`BufferRecord` under ``"buffer"`` as a plain dict
(read by ``torch.load(weights_only=True)``); every reader asks the record its kind, where
its dumps are (:func:`record_dumps`) and how many ranks saved it. Kinds: ``inline`` (in
the ``.ckpt``), ``beside`` (``<ckpt>.buffer/<version>``), ``ranks`` (one dump per DDP rank),
``actor`` (a Ray buffer's, by its actor), ``shards`` (one per shard), ``elsewhere`` (in rank
0's checkpoint) and ``mixture`` (one record per member). A pre-release checkpoint (a dict
tagged ``"location"``) is refused with a :class:`~rb_lightning.errors.BufferCheckpointError`.

Examples:
    >>> record = BufferRecord(kind="beside", len=3, write_count=3, dir="last.ckpt.buffer",
    ...                       version="v1")
    >>> saved = record.to_dict()
    >>> saved["kind"], saved["record"]
    ('beside', 1)
    >>> BufferRecord.from_dict(saved) == record
    True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.files import errors_naming, unpacked_directory

__all__ = [
    "RANK_PREFIX",
    "RECORD_VERSION",
    "BufferRecord",
    "RecordKind",
    "find_record",
    "is_record",
    "mixture_record",
    "record_dumps",
    "resolve_records_in",
]

#: Version of the record's layout; a checkpoint with a newer one is refused.
RECORD_VERSION = 1
RANK_PREFIX = "rank"  # <version>/rank<r>: one dump per DDP rank

RecordKind = Literal["inline", "beside", "ranks", "actor", "shards", "elsewhere", "mixture"]
KINDS: tuple[str, ...] = get_args(RecordKind)
#: A checkpoint whose buffer is a dict tagged ``"location"``: the format before the record.
PRE_RELEASE_FORMAT = (
    "The checkpoint's replay buffer was saved in a pre-release rb_lightning format (a dict "
    "tagged 'location', from before BufferRecord), which this version does not read: "
    "checkpoints of earlier, unreleased formats are refused rather than guessed at. Re-create "
    "it: resume from a checkpoint written by this version of rb_lightning, or start a new run."
)
#: Kinds whose dumps live in a directory beside the ``.ckpt``.
BESIDE_KINDS = frozenset({"beside", "ranks", "actor", "shards"})
#: Kinds holding the buffer of processes of this run, which a resume can deal out anew.
RANK_KINDS = frozenset({"inline", "beside", "ranks"})


@dataclass(frozen=True)
class BufferRecord:
    """A saved buffer's state, by kind (see the module's table).

    Attributes:
        kind: What the checkpoint holds.
        len: Items saved (all ranks' together for ``ranks``).
        write_count: The buffer's ``write_count`` when saved.
        archive: ``inline``: the packed dump (a ``uint8`` tensor).
        dir: Beside kinds: the directory beside the ``.ckpt`` (``last.ckpt.buffer``).
        version: Beside kinds: the dump's version directory inside ``dir``.
        world_size: ``ranks``: how many DDP ranks saved a dump each.
        members: ``mixture``: one record per member, in source-id order.
        generator: ``mixture``: the state of the generator every member samples with.
        composition: ``mixture``: its fractions or weights as given
            (``BufferMixture.composition``); ``None`` in checkpoints written before.
        resolved: Beside kinds, once read from a file: the dump's directory.
    """

    kind: RecordKind
    len: int = 0
    write_count: int = 0
    archive: torch.Tensor | None = None
    dir: str | None = None
    version: str | None = None
    world_size: int = 1
    members: dict[str, BufferRecord] = field(default_factory=dict)
    generator: torch.Tensor | None = None
    composition: dict[str, Any] | None = None
    resolved: str | None = None

    def __eq__(self, other: object) -> bool:
        # By value: the generated __eq__ would compare tensors elementwise and fail.
        if not isinstance(other, BufferRecord):
            return NotImplemented
        return _comparable(self.to_dict()) == _comparable(other.to_dict())

    # -- questions every reader asks ---------------------------------------------------------
    @property
    def is_beside(self) -> bool:
        """Whether the dumps are in a directory beside the ``.ckpt``."""
        return self.kind in BESIDE_KINDS

    @property
    def is_mixture(self) -> bool:
        return self.kind == "mixture"

    @property
    def saved_world_size(self) -> int:
        """Processes whose buffers the record holds, one each (``1``: one buffer)."""
        return self.world_size if self.kind == "ranks" else 1

    @property
    def names(self) -> list[str]:
        """A mixture's member names, in source-id order (``[]`` for any other kind)."""
        return list(self.members)

    def describe(self) -> str:
        """The kind in words, for messages ("its buffer saved beside it").

        Examples:
            >>> BufferRecord(kind="ranks", world_size=2).describe()
            'one buffer per DDP rank (2 ranks), saved beside it'
        """
        return {
            "inline": "its buffer inside the .ckpt",
            "beside": "its buffer saved beside it",
            "ranks": f"one buffer per DDP rank ({self.world_size} ranks), saved beside it",
            "actor": "a Ray buffer's content, saved beside it by its actor",
            "shards": "a sharded Ray buffer's content, saved beside it by its actors",
            "elsewhere": "no buffer: rank 0's checkpoint holds it",
            "mixture": f"a BufferMixture of {self.names}",
        }[self.kind]

    def directory(self, checkpoint_path: str | os.PathLike | None) -> Path:
        """The dump directory of a beside kind, for the ``.ckpt`` at ``checkpoint_path``."""
        if not self.is_beside:
            raise BufferCheckpointError(
                f"A replay buffer saved as {self.kind!r} has no directory beside the .ckpt."
            )
        if self.resolved is not None:
            return Path(self.resolved)
        if checkpoint_path is None:
            raise BufferCheckpointError(
                "The checkpoint keeps its replay buffer beside the .ckpt file, but the "
                "checkpoint path is unknown. Resume with Trainer.fit(..., ckpt_path=<file>)."
            )
        folder = Path(os.path.realpath(checkpoint_path)).parent
        return folder / str(self.dir) / str(self.version)

    def with_resolved(self, checkpoint_path: str | os.PathLike) -> BufferRecord:
        """This record with its (and its members') beside directories resolved."""
        if self.is_mixture:
            members = {n: m.with_resolved(checkpoint_path) for n, m in self.members.items()}
            return replace(self, members=members)
        if self.is_beside and self.resolved is None:
            return replace(self, resolved=str(self.directory(checkpoint_path)))
        return self

    # -- the dict a checkpoint stores --------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The record as the checkpoint stores it: only the fields its kind uses."""
        saved: dict[str, Any] = {"record": RECORD_VERSION, "kind": self.kind}
        if self.kind == "mixture":
            saved["members"] = {name: m.to_dict() for name, m in self.members.items()}
            saved["generator"] = self.generator
            if self.composition is not None:
                saved["composition"] = self.composition
            return saved
        if self.kind == "elsewhere":
            return saved
        saved.update(len=int(self.len), write_count=int(self.write_count))
        if self.kind == "inline":
            saved["archive"] = self.archive
        else:
            saved.update(dir=self.dir, version=self.version)
        if self.kind == "ranks":
            saved["world_size"] = int(self.world_size)
        if self.resolved is not None:
            saved["resolved"] = self.resolved
        return saved

    @classmethod
    def of(cls, saved: BufferRecord | Mapping[str, Any]) -> BufferRecord:
        """``saved`` if it is a record already, else :meth:`from_dict` of it."""
        return saved if isinstance(saved, BufferRecord) else cls.from_dict(saved)

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> BufferRecord:
        """Read a record stored by :meth:`to_dict`."""
        if "location" in saved and "kind" not in saved:
            raise BufferCheckpointError(PRE_RELEASE_FORMAT)
        version = saved.get("record")
        if not isinstance(version, int) or version > RECORD_VERSION:
            raise BufferCheckpointError(
                f"The checkpoint's replay-buffer record has version {version!r}, and this "
                f"rb_lightning reads versions up to {RECORD_VERSION}. Read it with the "
                "rb_lightning version that wrote it, or upgrade rb_lightning."
            )
        kind = saved.get("kind")
        if kind not in KINDS:
            raise BufferCheckpointError(
                f"Unknown replay-buffer record kind {kind!r}: this rb_lightning reads "
                f"{', '.join(KINDS)}. Read the checkpoint with the rb_lightning version that "
                "wrote it."
            )
        members = {
            name: cls.from_dict(member) for name, member in (saved.get("members") or {}).items()
        }
        return cls(
            kind=kind,
            len=int(saved.get("len", 0)),
            write_count=int(saved.get("write_count", 0)),
            archive=saved.get("archive"),
            dir=saved.get("dir"),
            version=saved.get("version"),
            world_size=int(saved.get("world_size", 1)),
            members=members,
            generator=saved.get("generator"),
            composition=saved.get("composition"),
            resolved=saved.get("resolved"),
        )


def mixture_record(
    members: Mapping[str, Any],
    generator: torch.Tensor | None,
    composition: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of a mixture as the checkpoint stores it, in source-id order.

    ``members``: each member's record (a dump request at save time, replaced in place by
    ``BufferCheckpointIO``); ``composition``: the fractions or weights a resume must match.
    """
    saved: dict[str, Any] = {
        "record": RECORD_VERSION,
        "kind": "mixture",
        "members": dict(members),
        "generator": generator,
    }
    if composition is not None:
        saved["composition"] = dict(composition)
    return saved


def _comparable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.flatten().tolist())
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    return value


def is_record(value: Any) -> bool:
    """Whether ``value`` is a saved buffer record as a checkpoint stores it.

    A record of the pre-release format counts, so that reading it raises the error that
    says so rather than finding no buffer.

    Examples:
        >>> is_record({"record": 1, "kind": "inline"}), is_record({"location": "beside"})
        (True, True)
        >>> is_record({"state_dict": {}})
        False
    """
    return isinstance(value, Mapping) and (
        "kind" in value and "record" in value or "location" in value
    )


def find_record(checkpoint: Any) -> BufferRecord | None:
    """The buffer record a ``ReplayBufferDataModule`` saved in a loaded checkpoint dict.

    Lightning stores a DataModule's ``state_dict`` under its class name; this
    finds it by content (a ``"buffer"`` entry that is a record), so a subclass of
    the DataModule is found too. ``None`` when there is none.

    Examples:
        >>> find_record({"ReplayBufferDataModule": {"buffer": {"record": 1, "kind": "elsewhere"}}})
        BufferRecord(kind='elsewhere', len=0, write_count=0, archive=None, dir=None, version=None, world_size=1, members={}, generator=None, composition=None, resolved=None)
        >>> find_record({"state_dict": {}}) is None
        True
    """
    if not isinstance(checkpoint, Mapping):
        return None
    for value in checkpoint.values():
        if isinstance(value, Mapping) and is_record(value.get("buffer")):
            return BufferRecord.from_dict(value["buffer"])
    return None


@contextlib.contextmanager
def record_dumps(
    record: BufferRecord, checkpoint_path: str | os.PathLike | None
) -> Iterator[dict[str, Path]]:
    """The dump directories a record holds, by name: the one map of a record to its files.

    ``{"": dir}`` for one buffer, ``{member: dir}`` for a mixture, ``{"rank0": dir, ...}`` per
    rank, ``{}`` for ``elsewhere``; an ``inline`` dump is unpacked into a temporary directory.
    """
    with contextlib.ExitStack() as stack:
        if record.is_mixture:
            dumps: dict[str, Path] = {}
            for name, member in record.members.items():
                dumps[name] = stack.enter_context(record_dumps(member, checkpoint_path))[""]
            # A member's folder (a hash, or a temporary one) means nothing without its name.
            members = {str(root): f"{root} (member {name!r})" for name, root in dumps.items()}
            with errors_naming(members):
                yield dumps
        elif record.kind == "inline":
            if record.archive is None:
                raise BufferCheckpointError(
                    f"The checkpoint {checkpoint_path} has an inline replay buffer without its "
                    "archive: the file is damaged. Resume from an earlier checkpoint."
                )
            yield {"": stack.enter_context(unpacked_directory(record.archive, checkpoint_path))}
        elif record.kind == "ranks":
            root = record.directory(checkpoint_path)
            yield {
                f"{RANK_PREFIX}{r}": root / f"{RANK_PREFIX}{r}" for r in range(record.world_size)
            }
        elif record.kind == "elsewhere":
            yield {}
        else:
            yield {"": record.directory(checkpoint_path)}


def resolve_records_in(
    checkpoint: MutableMapping[str, Any], checkpoint_path: str | os.PathLike
) -> None:
    """Give each buffer record in a loaded checkpoint dict its dump directory, in place (from the real path of the file read)."""
    for value in checkpoint.values():
        if not isinstance(value, MutableMapping):
            continue
        if is_record(value.get("buffer")):
            record = BufferRecord.from_dict(value["buffer"])
            value["buffer"] = record.with_resolved(checkpoint_path).to_dict()
        else:
            resolve_records_in(value, checkpoint_path)

"""A fit that fails while it runs, told as one paragraph: the Ray buffer actor gone.

A DDP run stops on every rank when its buffer's actor dies, and one rank tells why:
global rank 0. A rank sees the death in one of two ways, by chance of timing: a
call to the actor fails (Ray's ``ActorDiedError``), or its peer left a collective
(gloo's ``Connection closed by peer``) because that peer saw it first. Rank 0 asks
the buffer in the second case; the other ranks end quietly (exit code 2), as
:func:`quiet_exit` says, so the terminal holds one paragraph, not one traceback per
rank. No collective runs on this path: a rank that waits in one for a peer that
is gone would wait for DDP's 30-minute timeout.

Ray is not imported: its errors are recognised by their class names.

Examples:
    >>> lost_actor(RuntimeError("Connection closed by peer [127.0.0.1]:1")) is None
    True
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rb_lightning.errors import BufferStateError
from rb_lightning.runs.config_errors import exception_chain

__all__ = ["buffer_actor_lost", "lost_actor", "peer_left", "quiet_exit"]

# ray.exceptions: ActorDiedError is a RayActorError; ActorUnavailableError while it restarts.
_ACTOR_GONE = {"ActorDiedError", "RayActorError", "ActorUnavailableError"}


def lost_actor(err: BaseException) -> BaseException | None:
    """Ray's error saying an actor is gone, if ``err`` is or comes from one."""
    for part in exception_chain(err):
        kinds = type(part).__mro__
        if any(k.__module__.startswith("ray") and k.__name__ in _ACTOR_GONE for k in kinds):
            return part
    return None


def peer_left(err: BaseException) -> bool:
    """Whether ``err`` says another rank left a collective (it stopped, or its process ended)."""
    return any(
        "closed by peer" in str(part) or "reset by peer" in str(part)
        for part in exception_chain(err)
    )


def quiet_exit(err: BaseException, *, global_zero: bool) -> bool:
    """Whether this rank ends without a word: not rank 0, and the buffer's actor or a peer
    is gone (rank 0 tells it)."""
    return not global_zero and (lost_actor(err) is not None or peer_left(err))


def buffer_actor_lost(
    err: BaseException,
    *,
    step: int,
    last_checkpoint: str | None,
    resume: str,
    ask_buffer: Callable[[], Any] | None = None,
) -> BufferStateError | None:
    """The paragraph for rank 0 when the run's buffer actor is gone, else ``None``.

    Args:
        err: What stopped the fit.
        step: The step it stopped at.
        last_checkpoint: Path of the run's last checkpoint, if one was written.
        resume: The command that resumes the run.
        ask_buffer: Called when ``err`` says a peer left: touches the buffer (``len``),
            which raises Ray's error if its actor is gone.
    """
    gone = lost_actor(err)
    if gone is None and ask_buffer is not None and peer_left(err):
        try:
            ask_buffer()
        except Exception as asked:
            gone = lost_actor(asked)
    if gone is None:
        return None
    text = str(gone)
    name = re.search(r"^\s*name: (\S+)", text, re.MULTILINE)
    namespace = re.search(r"^\s*namespace: (\S+)", text, re.MULTILINE)
    why = re.search(r"The actor is dead because (.+?)\.?$", text, re.MULTILINE)
    actor = f"'{name.group(1)}'" if name else ""
    if name and namespace:
        actor += f" (namespace {namespace.group(1)})"
    because = f" ({why.group(1).rstrip('.')})" if why else ""
    if last_checkpoint:
        saved = (
            f"The last checkpoint, {last_checkpoint}, saved the buffer with the model: "
            f"resume with `{resume}`, which builds a new actor and loads that buffer into it."
        )
    else:
        saved = "No checkpoint was written yet: start the run again."
    return BufferStateError(
        f"the Ray buffer actor {actor} is gone{because}, at step {step:,}: the items it held "
        f"went with it, so the run stops on every rank. {saved}".replace("actor  is", "actor is")
    )

"""A process that generates GRPO groups beside training, with weights at most ``s`` versions old.

:class:`GenerationWorker` starts one process holding its own copy of the policy; it
generates batch after batch of whole groups (batch ``i`` seeded by ``i``) and sends each
with the version of the weights that made it. Batch ``i`` is trained on at step ``i``, so
the worker starts it only with weights of version ``>= i - max_staleness`` (AReaL's
``max_head_offpolicyness``): it never runs further ahead. Given a buffer it can share
(``write_into``) the worker extends it and sends a notice; otherwise groups cross the
pipe as numpy arrays. Shared memory is torch's file-descriptor kind, unlinked at once, so a
killed process leaves nothing in ``/dev/shm``.

Examples:
    >>> from transformers import LlamaConfig
    >>> config = LlamaConfig(vocab_size=18, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, pad_token_id=0, eos_token_id=1)
    >>> from rb_lightning.llm.grpo import GRPOModule
    >>> policy = GRPOModule(config, num_generations=2, prompts_per_step=2)
    >>> worker = GenerationWorker(
    ...     dict(config=config, num_generations=2, prompts_per_step=2, store_text=False),
    ...     max_staleness=1, first_batch=0, start_method="fork")
    >>> worker.push_weights(policy.model.state_dict(), version=0)
    >>> index, groups, waited = worker.receive(timeout=120)
    >>> index, groups.shape, groups["policy_version"].unique().tolist()
    (0, torch.Size([4]), [0])
    >>> worker.close()
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import time
import traceback
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict

from rb_lightning.buffers.shared_writes import WorkerWrites
from rb_lightning.errors import CollectorError, SampleTimeoutError
from rb_lightning.torchrl_compat import can_share_writes, only_view_attached

__all__ = ["GenerationWorker"]

_POLL_S = 0.05


def _flat_weights(state_dict: dict[str, torch.Tensor]) -> bytes:
    # One float32 byte string: a tenth of the time of torch.save for the shipped model.
    flat = torch.cat([t.detach().reshape(-1).float().cpu() for t in state_dict.values()])
    return flat.numpy().tobytes()


def _load_flat_weights(model: torch.nn.Module, data: bytes) -> None:
    flat = torch.frombuffer(bytearray(data), dtype=torch.float32)
    offset = 0
    with torch.no_grad():
        for tensor in model.state_dict().values():
            n = tensor.numel()
            tensor.copy_(flat[offset : offset + n].view_as(tensor))
            offset += n


def _groups_to_wire(groups: TensorDict) -> dict[str, Any]:
    # numpy arrays pickle as plain bytes; torch tensors through a multiprocessing queue would
    # go through shared memory (a /dev/shm file per tensor).
    return {
        key: value.numpy() if isinstance(value, torch.Tensor) else value.tolist()
        for key, value in groups.items()
    }


def _groups_from_wire(data: dict[str, Any]) -> TensorDict:
    columns: dict[str, Any] = {}
    for key, value in data.items():
        columns[key] = (
            torch.from_numpy(value) if hasattr(value, "dtype") else NonTensorStack(*value)
        )
    n = next(len(v) for v in data.values())
    return TensorDict(columns, batch_size=[n])


def _run(
    module_kwargs: dict[str, Any],
    max_staleness: int,
    first_batch: int,
    threads: int,
    weights: Any,
    groups: Any,
    stop: Any,
    parent: int,
    buffer_view: Any = None,
) -> None:
    """The worker process: generate batch ``first_batch``, the next, ... until ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    torch.set_num_threads(threads)
    try:
        from rb_lightning.llm.grpo import GRPOModule

        policy = GRPOModule(**module_kwargs)
        policy.model.eval()
        version = -1
        index = first_batch

        def alive() -> bool:
            # A trainer killed with SIGKILL runs no clean-up: its worker notices and ends.
            return not stop.is_set() and os.getppid() == parent

        while alive():
            started = time.perf_counter()
            newest = None
            # The newest weights sent, waiting until they are recent enough for batch `index`.
            while alive():
                try:
                    while True:
                        newest = weights.get_nowait()
                except queue.Empty:
                    pass
                held = newest[0] if newest is not None else version
                if held >= index - max_staleness:
                    break
                try:
                    newest = weights.get(timeout=_POLL_S)
                except queue.Empty:
                    pass
            if not alive():
                return
            if newest is not None:
                version = newest[0]
                _load_flat_weights(policy.model, newest[1])
            waited = time.perf_counter() - started
            batch = policy.generate_groups(index, version=version)
            if buffer_view is not None:  # written where it was made; the trainer gets a notice
                buffer_view.extend(batch)
                message: tuple[Any, ...] = ("written", index, batch.numel(), waited)
            else:
                message = ("groups", index, _groups_to_wire(batch), waited)
            while alive():
                try:
                    groups.put(message, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            index += 1
    except BaseException as error:  # reported to the trainer, which ends the run
        text = "".join(traceback.format_exception(error))
        print(f"GRPO generation worker (pid {os.getpid()}):\n{text}", file=sys.stderr, flush=True)
        groups.put(("error", f"{type(error).__name__}: {error}", {}, 0.0))
        groups.close()
        groups.join_thread()
        sys.exit(1)


class GenerationWorker:
    """One generation process; see the module's docstring.

    Args:
        module_kwargs: The :class:`~rb_lightning.llm.grpo.GRPOModule` arguments of the
            worker's copy; its weights come from :meth:`push_weights`.

    Keyword Args:
        max_staleness: Batch ``i`` is generated with weights of version ``>= i - max_staleness``.
        first_batch: The index of the first batch generated (on resume: the next one not stored).
        start_method: ``multiprocessing`` start method (``"spawn"``: a fresh interpreter).
        threads: Torch threads of the worker.
        write_into: The buffer the worker extends itself when torchrl can share it and the
            groups carry no text (:attr:`writes` says so); ``None``: the trainer writes
            what :meth:`receive` hands back.
    """

    def __init__(
        self,
        module_kwargs: dict[str, Any],
        *,
        max_staleness: int,
        first_batch: int,
        start_method: str = "spawn",
        threads: int = 1,
        write_into: Any = None,
    ) -> None:
        context = multiprocessing.get_context(start_method)
        #: The worker's writes into ``write_into`` (``None``: the trainer writes the groups).
        self.writes: WorkerWrites | None = None
        if (
            write_into is not None
            and not module_kwargs.get("store_text", False)
            and can_share_writes(write_into)
        ):
            self.writes = WorkerWrites(write_into, context)
        self._rows_noticed = 0 if self.writes is None else self.writes.rows_learned
        self._weights = context.Queue()
        # At most max_staleness + 1 batches can be generated ahead: the bound keeps it so.
        self._groups = context.Queue(maxsize=max_staleness + 2)
        self._stop = context.Event()
        self._process = context.Process(  # type: ignore[attr-defined]  # every start method's context has it
            target=_run,
            args=(
                module_kwargs, max_staleness, first_batch, threads, self._weights,
                self._groups, self._stop, os.getpid(),
                None if self.writes is None else self.writes.view,
            ),
            name="rb-lightning-grpo-generation",
            daemon=True,
        )  # fmt: skip
        # The worker starts with Ctrl-C ignored (inherited through exec): a Ctrl-C while it
        # imports must not print the start-up's "stopped by Ctrl-C" line from it.
        previous = signal.getsignal(signal.SIGINT)
        in_main = _in_main_thread()
        if in_main:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.writes is None:
                self._process.start()
            else:
                with only_view_attached(write_into, self.writes.view):
                    self._process.start()
        except BaseException:
            if self.writes is not None:
                self.writes.close()
            raise
        finally:
            if in_main:
                signal.signal(signal.SIGINT, previous)
        self.pid = self._process.pid

    def push_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Send ``state_dict`` (copied now) as the weights of ``version``; returns at once."""
        self._weights.put((int(version), _flat_weights(state_dict)))

    def receive(self, timeout: float | None) -> tuple[int, TensorDict, float] | None:
        """The next generated batch: ``(index, groups, seconds the worker waited for weights)``.

        ``timeout=None``: only what has arrived (else ``None``); otherwise waits up to ``timeout``
        (then :class:`~rb_lightning.errors.SampleTimeoutError`). A dead or failed worker raises
        :class:`~rb_lightning.errors.CollectorError`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if deadline is None:
                    kind, index, data, waited = self._groups.get(block=False)
                else:
                    kind, index, data, waited = self._groups.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._process.is_alive():
                    self._died()
                if deadline is None:
                    return None
                if time.monotonic() >= deadline:
                    raise SampleTimeoutError(
                        f"The trainer waited {timeout:g}s for the GRPO generation worker (pid "
                        f"{self.pid}) and no groups arrived. Generation of one batch should "
                        "take well under that: raise model.init_args.worker_timeout if it "
                        "legitimately takes longer.",
                        argument="model.init_args.worker_timeout",
                    ) from None
                continue
            if kind == "error":
                self._process.join(timeout=5)
                raise CollectorError(
                    f"The GRPO generation worker process raised {index} (in the model's "
                    "generation or a reward function of model.init_args.rewards); its "
                    "traceback is above. The run stops; its last.ckpt (if one was saved) "
                    "resumes with --ckpt_path last once the cause is fixed.",
                    argument="model.init_args.rewards",
                )
            if kind == "written":
                return int(index), self._learn(int(data)), float(waited)
            return int(index), _groups_from_wire(data), float(waited)

    def _learn(self, rows: int) -> TensorDict:
        # The batch's rows are the next `rows` the worker wrote: learn them, read them back.
        assert self.writes is not None
        self._rows_noticed += rows
        index = self.writes.learn(up_to=self._rows_noticed)
        return self.writes.replay_buffer[index]

    def _died(self) -> None:
        code = self._process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        raise CollectorError(
            f"The GRPO generation worker process (pid {self.pid}) died ({how}) before sending "
            "its groups: it was killed from outside (the out-of-memory killer, a kill command) "
            "or crashed. The run stops; its last.ckpt (if one was saved) resumes with "
            "--ckpt_path last.",
            argument="model",
        )

    def cpu_seconds(self) -> float | None:
        """CPU time the worker process used so far (Linux ``/proc``; ``None`` elsewhere)."""
        try:
            fields = open(f"/proc/{self.pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        """Stop the worker and wait for it (killing it after a few seconds); idempotent."""
        self._stop.set()
        process = self._process
        if process.is_alive():
            # Free a worker blocked on a full groups queue.
            deadline = time.monotonic() + 5
            while process.is_alive() and time.monotonic() < deadline:
                try:
                    self._groups.get(timeout=_POLL_S)
                except queue.Empty:
                    pass
            if process.is_alive():
                process.kill()
        process.join(timeout=5)
        for channel in (self._weights, self._groups):
            channel.cancel_join_thread()  # unsent weights of a stopped run are worthless
            channel.close()
        if self.writes is not None:
            self.writes.close()
            self.writes = None


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()

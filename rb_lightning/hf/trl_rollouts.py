"""GRPO rollouts into a torchrl replay buffer, saved with TRL's checkpoints.

:class:`RolloutRecorder`, a ``transformers.TrainerCallback`` attached to a
``trl.GRPOTrainer``, writes every generation into a ``ReplayBuffer`` during ``.train()``,
dumps it into each checkpoint folder (``checkpoint-N/rb_lightning_rollouts``) and loads it
back on resume, so every rollout up to the checkpoint is in the buffer exactly once. Every
process records the whole global batch (TRL gathers it); process 0 writes the dump.

One row per completion: ``prompt``, ``completion`` (str; a conversation as its JSON text),
``reward`` (TRL's weighted sum), ``rewards.X`` (function ``X``'s value, NaN for None),
``advantage``, ``step`` (1-based optimizer step), ``generation``, ``group`` (run-wide ids)
and ``index`` (position in the generation's global batch).

Examples:
    >>> from rb_lightning.hf.trl_rollouts import RolloutRecorder
    >>> recorder = RolloutRecorder(capacity=1_000)
    >>> len(recorder.replay_buffer), recorder.generations
    (0, 0)

    With a trainer (see docs/trl.md)::

        trainer = trl.GRPOTrainer(...)
        recorder = RolloutRecorder().attach(trainer)
        trainer.train()  # or .train(resume_from_checkpoint=True)
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.errors import ArgumentTypeError, PathNotFoundError, UsageError
from rb_lightning.persist.dumps import dump_buffer, load_dump
from rb_lightning.persist.files import publish_version, sync_path
from rb_lightning.persist.manifest import read_manifest

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        'rb_lightning.hf.trl_rollouts needs the "hf" extra: pip install "rb-lightning[hf]"'
    ) from err

#: Folder of the rollout buffer inside each TRL checkpoint folder.
ROLLOUTS_DIR = "rb_lightning_rollouts"
#: transformers' checkpoint folder prefix (``checkpoint-<global_step>``).
CHECKPOINT_PREFIX = "checkpoint-"
#: TRL members the recorder reads; checked when attaching (tested with trl 1.16).
_TRL_MEMBERS = ("_generate_and_score_completions", "_logs", "num_generations", "reward_weights")


def _text(value: Any) -> str:
    # Conversational prompts are lists of {"role", "content"} messages: keep them as JSON.
    return value if isinstance(value, str) else json.dumps(value)


class RolloutRecorder(TrainerCallback):
    """Record ``GRPOTrainer`` rollouts into a replay buffer that survives checkpoints and resume.

    Args:
        replay_buffer: The buffer to write to; default a new
            ``ReplayBuffer(storage=LazyTensorStorage(capacity))``. When it is
            full the oldest rollouts are overwritten.

    Keyword Args:
        capacity: Size of the default buffer (ignored when ``replay_buffer`` is given).

    Attributes:
        replay_buffer: The buffer the rollouts are written to.
        generations: Generations recorded (restored ones included).
    """

    def __init__(self, replay_buffer: ReplayBuffer | None = None, *, capacity: int = 100_000):
        self.replay_buffer = replay_buffer or ReplayBuffer(storage=LazyTensorStorage(capacity))
        self.generations = 0
        self._trainer: Any = None

    # -- wiring ---------------------------------------------------------------------------------
    def attach(self, trainer: Any) -> RolloutRecorder:
        """Record ``trainer``'s rollouts (a ``trl.GRPOTrainer``) and add this callback to it.

        TRL calls no callback with the rollouts, so this wraps the trainer's
        generate-and-score step (one call per generation, after which TRL's
        completion log holds exactly that generation, gathered from every
        process) and reads them there. Returns ``self``.
        """
        missing = [name for name in _TRL_MEMBERS if not hasattr(trainer, name)]
        if missing:
            raise ArgumentTypeError(
                "trainer",
                f"RolloutRecorder.attach needs a trl.GRPOTrainer (tested with trl 1.16); "
                f"{type(trainer).__name__} has no {', '.join(missing)}. Attach it to a "
                "GRPOTrainer, or pin trl to a version that has them.",
            )
        if self._trainer is not None:
            raise UsageError(
                "trainer",
                "This RolloutRecorder is already attached to a trainer: build one per trainer.",
            )
        generate = trainer._generate_and_score_completions

        def generate_and_record(*args: Any, **kwargs: Any) -> Any:
            output = generate(*args, **kwargs)
            if trainer.model.training:  # evaluation generations are not rollouts
                self._record(trainer)
            return output

        trainer._generate_and_score_completions = generate_and_record
        trainer.add_callback(self)
        self._trainer = trainer
        return self

    # -- recording ------------------------------------------------------------------------------
    def _record(self, trainer: Any) -> None:
        logs = trainer._logs
        size = trainer.args.generation_batch_size  # the global batch of one generation
        tail = slice(-size, None)
        prompts = [_text(p) for p in list(logs["prompt"])[tail]]
        completions = [_text(c) for c in list(logs["completion"])[tail]]
        advantages = torch.tensor(list(logs["advantages"])[tail], dtype=torch.float32)
        per_function = {
            name: torch.tensor(list(values)[tail], dtype=torch.float32)
            for name, values in logs["rewards"].items()
        }
        n = len(prompts)
        weights = trainer.reward_weights.detach().cpu().float()
        stacked = torch.stack(list(per_function.values()), dim=1)
        reward = (stacked * weights).nansum(dim=1)
        reward[stacked.isnan().all(dim=1)] = math.nan  # as TRL: no function scored it
        groups_per_generation = n // trainer.num_generations
        index = torch.arange(n)
        items = TensorDict(
            {
                "prompt": NonTensorStack(*prompts),
                "completion": NonTensorStack(*completions),
                "reward": reward,
                "rewards": TensorDict(per_function, batch_size=[n]),
                "advantage": advantages,
                "step": torch.full((n,), trainer.state.global_step + 1, dtype=torch.int64),
                "generation": torch.full((n,), self.generations, dtype=torch.int64),
                "group": self.generations * groups_per_generation
                + index // trainer.num_generations,
                "index": index,
            },
            batch_size=[n],
        )
        self.replay_buffer.extend(items)
        self.generations += 1

    # -- checkpoints ----------------------------------------------------------------------------
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Dump the buffer into the checkpoint folder transformers just wrote (process 0)."""
        if not state.is_world_process_zero:
            return
        target = Path(args.output_dir) / f"{CHECKPOINT_PREFIX}{state.global_step}" / ROLLOUTS_DIR
        staging = target.with_name(ROLLOUTS_DIR + ".tmp")
        for stale in (staging, target):
            if stale.exists():  # a save at the same step again, or a dead save's leftover
                shutil.rmtree(stale)
        dump_buffer(self.replay_buffer, staging, extra={"generations": self.generations})
        sync_path(staging)  # flushed before the rename: the checkpoint holds a whole dump or none
        publish_version(staging, target.parent, ROLLOUTS_DIR)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """On a resumed run, load the buffer saved with the checkpoint it resumes from."""
        if state.global_step == 0:
            return
        source = Path(args.output_dir) / f"{CHECKPOINT_PREFIX}{state.global_step}" / ROLLOUTS_DIR
        if not source.is_dir():
            raise PathNotFoundError(
                f"Training resumes at step {state.global_step}, but {source} does not exist, so "
                "the rollouts recorded before that checkpoint cannot be restored. Resume from a "
                f"checkpoint saved with a RolloutRecorder attached, in output_dir "
                f"({args.output_dir}), or start from step 0."
            )
        load_dump(self.replay_buffer, source)  # replaces what is in the buffer
        self.generations = int(read_manifest(source)["generations"])


__all__ = ["CHECKPOINT_PREFIX", "ROLLOUTS_DIR", "RolloutRecorder"]

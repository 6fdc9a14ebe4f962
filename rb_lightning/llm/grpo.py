"""``GRPOModule``: online GRPO for a causal LM, trained by Lightning from the DataModule's buffer.

Each training step at policy version ``v`` generates ``num_generations`` completions of
``prompts_per_step`` prompts (seeded by ``(seed, rank, step)``), scores them (TRL's reward
signature, summed), writes the whole groups with their advantages, behaviour log-probs
and ``policy_version = v`` into the buffer, then draws its batch through a
:class:`~rb_lightning.llm.groups.GroupSampler` (``max_staleness: 0``: this step's groups)
and minimises the clipped objective. ``validate`` / ``test`` decode greedily and log
``val_accuracy`` (or ``val_reward``).

Examples:
    From the command line, ``configs/llm_grpo.yaml`` (docs/llm.md). One step's groups:

    >>> from transformers import LlamaConfig
    >>> config = LlamaConfig(vocab_size=18, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, pad_token_id=0, eos_token_id=1)
    >>> module = GRPOModule(config, num_generations=4, prompts_per_step=2)
    >>> groups = module.generate_groups(step=0)
    >>> groups["group"].tolist(), groups["policy_version"].unique().tolist()
    ([0, 0, 0, 0, 1, 1, 1, 1], [0])
    >>> sorted(groups.keys())[:4]
    ['advantage', 'attention_mask', 'behaviour_log_probs', 'completion']
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from tensordict import NonTensorStack, TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer

from rb_lightning.errors import ArgumentTypeError, BufferStateError, UsageError
from rb_lightning.llm.generation import (
    completion_log_probs,
    decode_completions,
    encode_prompts,
    greedy_completions,
    sample_completions,
)
from rb_lightning.llm.group_ids import GroupIds
from rb_lightning.llm.groups import GroupSampler
from rb_lightning.llm.module import load_sft_weights
from rb_lightning.llm.objective import clipped_objective
from rb_lightning.llm.tasks import ArithmeticTask, PromptTask
from rb_lightning.policy_version import POLICY_VERSION_KEY
from rb_lightning.sources import resolve_callable

try:
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        'rb_lightning.llm.grpo needs the "hf" extra: pip install "rb-lightning[hf]"'
    ) from err

DEFAULT_REWARDS = ("rb_lightning.llm.data:arithmetic_reward",)
#: The values of ``GRPOModule(off_policy_correction=...)``.
OFF_POLICY_CORRECTIONS = ("none", "decoupled")


class GRPOModule(L.LightningModule):
    """Online GRPO on a task's prompts, with replay of whole groups through the DataModule.

    Args:
        config: The policy's ``transformers`` config (``LlamaConfig(...)``).

    Keyword Args:
        init_from: A :class:`~rb_lightning.llm.module.CausalLMModule` checkpoint whose
            weights start the policy. ``None``: random weights (said in the first log line).
        num_generations: Completions per prompt (the buffer's ``GroupSampler`` group size).
        prompts_per_step: Prompts per step. ``None``: ``batch_size // num_generations``.
        max_new_tokens: Longest completion, in tokens (eos included).
        temperature: Sampling temperature (also applied to the log-probs).
        lr: AdamW learning rate.
        clip_epsilon: Clip range of the importance ratio, ``[1 - eps, 1 + eps]``.
        beta: Weight of the KL to the starting policy (``0``: none, no reference model).
        rewards: Reward functions, ``"module:function"``; their sum is the reward.
        task: Prompts, tokenizer and correctness (:class:`~rb_lightning.llm.tasks.PromptTask`).
            ``None``: :class:`~rb_lightning.llm.tasks.ArithmeticTask`.
        prompt_width: Columns of the left-padded prompts (tokens).
        seed: Seed of the prompts and sampling (with the rank and step). ``None``: drawn from
            torch's generator when training starts (so ``seed_everything`` decides it); saved
            in checkpoints.
        store_text: Also store the ``prompt`` and ``completion`` strings (slow in torchrl
            0.14.1; :func:`rb_lightning.llm.pairs.with_text` decodes them at export).
        off_policy_correction: ``"none"``: the clipped ratio against the stored behaviour
            policy, as in TRL. ``"decoupled"``: AReaL's decoupled objective: the ratio
            against the weights before this step's update, each token weighted by
            ``min(exp(prox - behaviour), importance_weight_cap)`` (detached). Equal on fresh
            groups; on stale ones ``"none"`` silences tokens outside the clip range,
            ``"decoupled"`` keeps their gradient.
        importance_weight_cap: The largest importance weight of ``"decoupled"`` (verl's 2.0).
    """

    def __init__(
        self,
        config: PretrainedConfig,
        *,
        init_from: str | None = None,
        num_generations: int = 8,
        prompts_per_step: int | None = None,
        max_new_tokens: int = 4,
        temperature: float = 1.0,
        lr: float = 1e-3,
        clip_epsilon: float = 0.2,
        beta: float = 0.0,
        rewards: list[str] | None = None,
        task: PromptTask | None = None,
        prompt_width: int = 8,
        seed: int | None = None,
        store_text: bool = True,
        off_policy_correction: str = "none",
        importance_weight_cap: float = 2.0,
    ) -> None:
        super().__init__()
        if isinstance(config, Mapping) and "model_type" in config:  # from a checkpoint's hparams
            config = AutoConfig.for_model(**config)
        if not isinstance(config, PretrainedConfig):
            raise UsageError(
                "config",
                f"config must be a transformers PretrainedConfig (e.g. LlamaConfig(...)), got "
                f"{type(config).__name__}.",
            )
        for name, value in (
            ("num_generations", num_generations),
            ("max_new_tokens", max_new_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(name, f"{name} must be an int >= 1, got {value!r}.")
        if num_generations < 2:
            raise UsageError(
                "num_generations",
                "num_generations must be >= 2: a group-relative advantage compares each "
                "completion with the others of its prompt.",
            )
        if off_policy_correction not in OFF_POLICY_CORRECTIONS:
            raise UsageError(
                "off_policy_correction",
                f"off_policy_correction must be one of {list(OFF_POLICY_CORRECTIONS)}, got "
                f"{off_policy_correction!r}. 'decoupled' weights each token by its truncated "
                "importance weight against the behaviour policy (docs/llm.md); 'none' is the "
                "plain clipped objective.",
            )
        if isinstance(importance_weight_cap, bool) or not importance_weight_cap > 0:
            raise UsageError(
                "importance_weight_cap",
                f"importance_weight_cap must be a number > 0 (the largest importance weight "
                f"a token gets), got {importance_weight_cap!r}. 2.0 is verl's default.",
            )
        # The task is an object of the user's (its functions do not go into a checkpoint),
        # and the architecture is kept as a plain dict: a checkpoint of a module built in
        # Python then loads with torch's weights_only unpickler too.
        self.save_hyperparameters(ignore=["task"])
        if isinstance(self.hparams.get("config"), PretrainedConfig):  # not the CLI's own record
            self.hparams["config"] = config.to_dict()
        # Lightning's notes a user of this module can do nothing about: training_step takes the
        # loader's iterator (so no batch is sampled before this step's generation), and
        # validation is optional (a val_buffer of prompts).
        for message in ("Found `dataloader_iter` argument", "You are using the `dataloader_iter`",
                        "You defined a `validation_step` but have no `val_dataloader`"):  # fmt: skip
            warnings.filterwarnings("ignore", message=message)
        self.model = AutoModelForCausalLM.from_config(config)
        self.num_generations, self.max_new_tokens = num_generations, max_new_tokens
        self.temperature, self.lr, self.clip_epsilon = temperature, lr, clip_epsilon
        self.beta = beta
        self.task = task if task is not None else ArithmeticTask()
        if not isinstance(self.task, PromptTask):
            raise ArgumentTypeError(
                "task",
                f"task must be a rb_lightning.llm.tasks.PromptTask, got {type(task).__name__}.",
            )
        self.prompt_width, self.seed = prompt_width, seed
        self.store_text = store_text
        self._drawn_seed: int | None = None  # seed=None: drawn once, when first needed
        self._group_ids = GroupIds()
        self._micro, self._micro_step = 0, -1
        self.off_policy_correction = off_policy_correction
        self.importance_weight_cap = float(importance_weight_cap)
        self.init_from = init_from
        if init_from is not None:
            load_sft_weights(self.model, init_from)
        self.ref_model = None
        if beta > 0:
            self.ref_model = copy.deepcopy(self.model).requires_grad_(False).eval()
        self.reward_names = list(rewards if rewards is not None else DEFAULT_REWARDS)
        self.reward_functions = [resolve_callable(name, "rewards") for name in self.reward_names]
        self.prompts_per_step = prompts_per_step
        self._buffer: ReplayBuffer | None = None
        self._sampler: GroupSampler | None = None

    # -- setup ------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Check the buffer's sampler and the batch size (fit)."""
        if stage != "fit":
            return
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning's connectors
        buffer = getattr(datamodule, "replay_buffer", None)
        sampler = getattr(buffer, "sampler", None)
        group = self.num_generations
        if not isinstance(buffer, ReplayBuffer) or not isinstance(sampler, GroupSampler):
            raise UsageError(
                "data.init_args.replay_buffer.init_args.sampler",
                f"GRPOModule trains on whole groups: the DataModule's replay buffer needs a "
                f"sampler rb_lightning.llm.groups.GroupSampler(group_size={group}), it has "
                f"{type(sampler).__name__}. See configs/llm_grpo.yaml.",
            )
        if sampler.group_size != group:
            raise UsageError(
                "data.init_args.replay_buffer.init_args.sampler.init_args.group_size",
                f"GroupSampler(group_size={sampler.group_size}) but GRPOModule(num_generations="
                f"{group}): a group is the num_generations completions of a prompt. Set both to "
                "the same number.",
            )
        batch_size = int(datamodule.batch_size)
        sampler.check_batch_size(batch_size, "data.init_args.batch_size")
        if self.prompts_per_step is None:
            self.prompts_per_step = batch_size // group
        self._buffer, self._sampler = buffer, sampler
        _ = self.run_seed  # seed=None: drawn now, right after seed_everything and the model

    @property
    def run_seed(self) -> int:
        """The seed this run generates with: ``seed``, or the one drawn for ``seed=None``."""
        if self.seed is not None:
            return int(self.seed)
        if self._drawn_seed is None:
            self._drawn_seed = int(torch.randint(0, 2**31 - 1, ()).item())
        return self._drawn_seed

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["grpo_seed"] = self.run_seed
        checkpoint["grpo_group_ids"] = self._group_ids.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed = True
        if "grpo_seed" in checkpoint:
            self._drawn_seed = int(checkpoint["grpo_seed"])
        if "grpo_group_ids" in checkpoint:
            self._group_ids.load_state_dict(checkpoint["grpo_group_ids"])

    def on_fit_start(self) -> None:
        """Say where the policy starts (a resumed run: the CLI names the checkpoint)."""
        if getattr(self, "_resumed", False):
            return
        if self.init_from is None:
            rank_zero_info(
                "GRPO starts from scratch: random weights, which cannot learn arithmetic from a "
                "reward alone. Pass --model.init_from <last.ckpt of configs/llm_sft.yaml>."
                if isinstance(self.task, ArithmeticTask)
                else "GRPO starts from scratch: random weights, no init_from."
            )
        else:
            rank_zero_info(f"GRPO starts from the weights of {self.init_from}")

    # -- generation -------------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        """Optimizer updates applied to the policy so far (the global step)."""
        return int(self.global_step)

    def _world_size(self) -> int:
        try:
            return int(self.trainer.world_size)
        except RuntimeError:  # not attached to a Trainer: one process
            return 1

    def _generator(self, step: int, micro: int = 0) -> torch.Generator:
        # A function of (seed, rank, step, micro-batch) only: a resumed run draws what the
        # straight one did, and the micro-batches of one step (accumulate_grad_batches) differ.
        seed = (self.run_seed * 1_000_003 + self.global_rank) * 1_000_003 + step + micro * 2**40
        return torch.Generator(device=self.device).manual_seed(seed % (2**63))

    def _accumulation(self) -> int:
        try:
            return int(self.trainer.accumulate_grad_batches)
        except RuntimeError:  # not attached to a Trainer
            return 1

    def _micro_batch(self) -> int:
        """Which micro-batch of the current optimizer step this training_step is (0 first)."""
        step = self.global_step
        self._micro = self._micro + 1 if step == self._micro_step else 0
        self._micro_step = step
        return self._micro

    @property
    def tokenizer(self) -> Any:
        """The task's tokenizer."""
        return self.task.tokenizer

    def score(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        """The summed reward of each completion."""
        total = torch.zeros(len(prompts), dtype=torch.float32)
        for function in self.reward_functions:
            total += torch.tensor(function(completions, prompts=prompts), dtype=torch.float32)
        return total

    @torch.no_grad()
    def generate_groups(
        self, step: int, version: int | None = None, *, scored: bool = True, micro: int = 0
    ) -> TensorDict:
        """``prompts_per_step`` whole groups of ``num_generations`` scored completions (CPU).

        ``step`` (and ``micro``, the micro-batch) seeds the prompts and numbers the groups; items
        are stamped ``policy_version = version`` (``None``: ``step``). ``scored=False``: zero
        rewards, no reward function called.
        """
        generator = self._generator(step, micro)
        n_prompts = int(self.prompts_per_step or 1)
        prompts = self.task.draw(n_prompts, generator)
        repeated = [p for p in prompts for _ in range(self.num_generations)]
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.prompt_width)
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        was_training = self.model.training
        self.model.eval()
        out = sample_completions(
            self.model, prompt_ids, prompt_mask, max_new_tokens=self.max_new_tokens,
            eos_token_id=self.tokenizer.eos_token_id, pad_token_id=self.tokenizer.pad_token_id,
            generator=generator, temperature=self.temperature,
            completions_per_prompt=self.num_generations,
        )  # fmt: skip
        prompt_ids = prompt_ids.repeat_interleave(self.num_generations, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(self.num_generations, dim=0)
        input_ids = torch.cat([prompt_ids, out.completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, out.completion_mask], dim=1)
        behaviour = out.log_probs  # the sampling distribution's, from the draw's own logits
        self.model.train(was_training)
        completions = decode_completions(self.tokenizer, out.completion_ids)
        reward = (
            self.score(repeated, completions)
            if scored
            else torch.zeros(len(repeated), dtype=torch.float32)
        )
        grouped = reward.view(n_prompts, self.num_generations)
        advantage = (grouped - grouped.mean(1, keepdim=True)) / (
            grouped.std(1, keepdim=True) + 1e-4
        )
        first = self._group_ids.first(
            step=step, micro=micro, rank=self.global_rank, world_size=self._world_size(),
            accumulation=self._accumulation(), prompts=n_prompts,
        )  # fmt: skip
        group = torch.arange(first, first + n_prompts).repeat_interleave(self.num_generations)
        n = len(repeated)
        columns: dict[str, Any] = {
            "input_ids": input_ids.cpu(),
            "attention_mask": attention_mask.cpu(),
            "completion_mask": out.completion_mask.cpu(),
            "behaviour_log_probs": behaviour.cpu(),
            "reward": reward,
            "advantage": advantage.reshape(-1),
            "group": group,
            POLICY_VERSION_KEY: torch.full(
                (n,), step if version is None else version, dtype=torch.int64
            ),
        }
        if self.store_text:
            columns["prompt"] = NonTensorStack(*repeated)
            columns["completion"] = NonTensorStack(*completions)
        if self.ref_model is not None:
            columns["ref_log_probs"] = completion_log_probs(
                self.ref_model, input_ids, attention_mask, self.prompt_width,
                temperature=self.temperature,
            ).cpu()  # fmt: skip
        return TensorDict(columns, batch_size=[n])

    # -- training ---------------------------------------------------------------------------
    def grpo_loss(self, batch: TensorDictBase) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped GRPO objective of ``batch`` (token mean) and what to log about it."""
        logp = completion_log_probs(
            self.model, batch["input_ids"], batch["attention_mask"], self.prompt_width,
            temperature=self.temperature,
        )  # fmt: skip
        use_ref = self.ref_model is not None and self.beta > 0
        return clipped_objective(
            logp, behaviour=batch["behaviour_log_probs"], advantage=batch["advantage"],
            mask=batch["completion_mask"], clip_epsilon=self.clip_epsilon,
            decoupled=self.off_policy_correction == "decoupled",
            importance_weight_cap=self.importance_weight_cap,
            ref_log_probs=batch["ref_log_probs"] if use_ref else None, beta=self.beta,
        )  # fmt: skip

    def training_step(self, dataloader_iter: Iterator[Any]) -> torch.Tensor:
        """Generate this step's groups into the buffer, then train on the batch sampled after."""
        if self._buffer is None or self._sampler is None:
            raise BufferStateError(
                "GRPOModule has no buffer to write its groups to: train it with Trainer.fit and a "
                "ReplayBufferDataModule, whose setup('fit') hands the buffer over."
            )
        start = time.perf_counter()
        version = self.policy_version
        groups = self.generate_groups(version, micro=self._micro_batch())
        self._buffer.extend(groups)
        self._sampler.consumer_version = version
        batch, _, _ = next(dataloader_iter)
        if isinstance(batch, TensorDictBase) and batch.device != self.device:
            batch = batch.to(self.device)
        loss, stats = self.grpo_loss(batch)
        if self._writes_logs():
            self._log_step(loss, stats, groups, batch, time.perf_counter() - start)
        return loss

    def _writes_logs(self) -> bool:
        # Lightning writes step metrics every log_every_n_steps (counting the step about to
        # finish); a self.log call costs about 1 ms, an eighth of a step of the shipped model
        # for the eight values, so the steps whose values would not be written make none.
        every = int(self.trainer.log_every_n_steps)  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
        return every > 0 and (self.global_step + 1) % every == 0

    def _log_step(
        self,
        loss: torch.Tensor,
        stats: dict[str, torch.Tensor],
        groups: TensorDictBase,
        batch: TensorDictBase,
        seconds: float,
    ) -> None:
        lengths = groups["completion_mask"].sum(-1).float()
        staleness = (self.policy_version - batch[POLICY_VERSION_KEY].double()).mean()
        elapsed = max(seconds, 1e-9)
        size = batch.shape[0]
        self.log("train_loss", loss, prog_bar=True, batch_size=size)
        self.log("reward_mean", groups["reward"].mean(), prog_bar=True, batch_size=size)
        self.log("reward_std", groups["reward"].std(), batch_size=size)
        self.log("completion_length", lengths.mean(), batch_size=size)
        self.log("replay/staleness_mean", staleness.float(), batch_size=size)
        self.log("tokens_per_s", float(lengths.sum()) / elapsed, batch_size=size)
        for name, value in stats.items():
            self.log(name, value, batch_size=size)

    # -- evaluation -------------------------------------------------------------------------
    def greedy_completions(self, prompts: list[str]) -> list[str]:
        """The greedy completion of each of ``prompts`` by the current policy."""
        return greedy_completions(
            self.model, self.tokenizer, prompts,
            prompt_width=self.prompt_width, max_new_tokens=self.max_new_tokens,
        )  # fmt: skip

    def _evaluate(self, batch: TensorDictBase, stage: str) -> torch.Tensor:
        prompts = [str(p) for p in batch["prompt"]]
        self.task.check_eval_prompts(prompts)
        completions = self.greedy_completions(prompts)
        if self.task.has_answers:  # the task says what is right: accuracy
            name = f"{stage}_accuracy"
            right = [self.task.is_correct(p, c) for p, c in zip(prompts, completions, strict=True)]
            value = torch.tensor(right, dtype=torch.float32).mean()
        else:  # otherwise, what the rewards make of the greedy answers
            name = f"{stage}_reward"
            value = self.score(prompts, completions).mean()
        self.log(name, value, prog_bar=True, batch_size=len(prompts))
        return value

    def validation_step(self, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        return self._evaluate(batch, "val")

    def test_step(self, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        return self._evaluate(batch, "test")

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.0)


__all__ = ["DEFAULT_REWARDS", "OFF_POLICY_CORRECTIONS", "GRPOModule"]

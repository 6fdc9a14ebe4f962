"""``CausalLMModule``: a ``transformers`` causal LM, built from a config, trained on buffer batches.

The model is built with ``AutoModelForCausalLM.from_config`` (no download), so a YAML config
picks its architecture through ``class_path``. Batches hold int64 ``input_ids``,
``attention_mask`` and ``labels`` (``-100``: no loss; without ``labels`` every attended token
counts).

Examples:
    >>> from transformers import LlamaConfig
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.llm.data import fill_arithmetic_buffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(64))
    >>> fill_arithmetic_buffer(rb, 8)
    8
    >>> config = LlamaConfig(vocab_size=18, hidden_size=16, intermediate_size=32,
    ...                      num_hidden_layers=1, num_attention_heads=2)
    >>> bool(CausalLMModule(config).training_step(rb.sample(4), 0) > 0)
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from tensordict import TensorDictBase

from rb_lightning.errors import ArgumentTypeError, MissingKeyError, UsageError
from rb_lightning.llm.data import IGNORE_INDEX, greedy_accuracy, make_tokenizer

try:
    from transformers import AutoModelForCausalLM, PretrainedConfig
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        'rb_lightning.llm.module needs the "hf" extra: pip install "rb-lightning[hf]"'
    ) from err


class CausalLMModule(L.LightningModule):
    """Next-token training of a causal LM made from a ``transformers`` config.

    Args:
        config: The model's config, e.g. ``LlamaConfig(vocab_size=18, hidden_size=64, ...)``;
            the model is ``AutoModelForCausalLM.from_config(config)``, randomly initialised.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: Linear learning-rate warm-up over this many steps (0: none).
        input_key: Batch key of the token ids.
        attention_mask_key: Batch key of the attention mask (``None``: attend to every token).
        labels_key: Batch key of the labels (``-100`` = no loss). When the batch
            has no such key, the labels are the token ids with ``-100`` on padding.
        log_accuracy: Also log ``val_accuracy`` / ``test_accuracy``, as ``GRPOModule`` does:
            the fraction of the batch's ``prompt`` strings (the arithmetic task of
            :mod:`rb_lightning.llm.data`) whose greedy completion is right.
    """

    def __init__(
        self,
        config: PretrainedConfig,
        lr: float = 3e-3,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        *,
        input_key: str = "input_ids",
        attention_mask_key: str | None = "attention_mask",
        labels_key: str = "labels",
        log_accuracy: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(config, PretrainedConfig):
            raise ArgumentTypeError(
                "config",
                f"config must be a transformers PretrainedConfig (e.g. LlamaConfig(...)), got "
                f"{type(config).__name__}.",
            )
        self.save_hyperparameters()
        self.model = AutoModelForCausalLM.from_config(config)
        self.lr = lr
        self.weight_decay = weight_decay
        self.warmup_steps = warmup_steps
        self.input_key = input_key
        self.attention_mask_key = attention_mask_key
        self.labels_key = labels_key
        self.log_accuracy = bool(log_accuracy)
        self._tokenizer: Any = None

    def _loss(self, batch: TensorDictBase) -> torch.Tensor:
        keys = set(batch.keys())
        if self.input_key not in keys:
            raise MissingKeyError(
                "input_key",
                f"CausalLMModule: the batch has no {self.input_key!r} key (it has "
                f"{sorted(map(str, keys))}). Set input_key=, or fill the buffer with token ids.",
            )
        input_ids = batch[self.input_key]
        mask = batch[self.attention_mask_key] if self.attention_mask_key in keys else None
        if self.labels_key in keys:
            labels = batch[self.labels_key]
        else:
            labels = input_ids if mask is None else input_ids.masked_fill(mask == 0, IGNORE_INDEX)
        return self.model(input_ids=input_ids, attention_mask=mask, labels=labels).loss

    def training_step(self, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=batch.shape[0])
        return loss

    def validation_step(self, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("val_loss", loss, prog_bar=True, batch_size=batch.shape[0])
        self._log_accuracy(batch, "val_accuracy")
        return loss

    def test_step(self, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("test_loss", loss, batch_size=batch.shape[0])
        self._log_accuracy(batch, "test_accuracy")
        return loss

    def _log_accuracy(self, batch: TensorDictBase, name: str) -> None:
        if not self.log_accuracy:
            return
        if "prompt" not in batch.keys():
            raise MissingKeyError(
                "log_accuracy",
                "CausalLMModule(log_accuracy=True) scores the batch's 'prompt' strings, and "
                "this batch has none. Fill the evaluation buffer with text (fill_arithmetic_"
                "buffer's text=True) or set log_accuracy=False.",
            )
        if self._tokenizer is None:
            self._tokenizer = make_tokenizer()
        prompts = [str(p) for p in batch["prompt"]]
        accuracy = greedy_accuracy(self.model, self._tokenizer, prompts)
        self.log(name, accuracy, prog_bar=True, batch_size=len(prompts))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self.warmup_steps <= 0:
            return optimizer
        warmup = self.warmup_steps
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}




def load_sft_weights(model: Any, path: str) -> None:
    """Load the ``model.*`` weights of an SFT run's Lightning checkpoint into ``model``."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(
            "init_from",
            f"init_from={path!r}: no such file. Give the last.ckpt of an SFT run "
            "(python train.py fit --config configs/llm_sft.yaml writes "
            "runs/llm_sft/version_<N>/checkpoints/last.ckpt), or drop init_from to start "
            "from random weights.",
        )
    # A Lightning checkpoint the user made: it holds the SFT run's buffer too.
    state = torch.load(file, map_location="cpu", weights_only=False)
    weights = {
        k.removeprefix("model."): v
        for k, v in state.get("state_dict", {}).items()
        if k.startswith("model.")
    }
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise UsageError(
            "init_from",
            f"init_from={path!r} does not fit this model: {str(err).splitlines()[0]} "
            "Give model.init_args.config the architecture the checkpoint was trained with "
            "(the llm_sft.yaml model block).",
        ) from None


__all__ = [
    "load_sft_weights",
    "CausalLMModule",
]

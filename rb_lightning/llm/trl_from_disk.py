"""Train a TRL trainer on a ``datasets`` folder exported from a Lightning run.

    python train.py fit --config configs/llm_sft.yaml --trainer.max_steps 300
    rb-lightning-export-hf runs/llm_sft sft_data --keys prompt completion
    python -m rb_lightning.llm.trl_from_disk sft_data --model runs/llm_sft --trainer sft grpo

``--model`` names the Lightning run whose model TRL continues (without it, a fresh tiny
Llama). SFT goes on with the run's own optimizer state, schedule, batch size and clipping
(:class:`LightningRun`), so its loss starts where the run's stopped. The data is
``datasets.load_from_disk`` of the export, as any TRL script would read it.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any, cast

from rb_lightning.llm.data import arithmetic_reward, make_tokenizer

#: The learning rates of configs/llm_sft.yaml and llm_grpo.yaml: TRL's defaults (2e-5, 1e-6)
#: are for large pretrained models and leave this tiny one where it was.
_LEARNING_RATES = {"sft": 3e-3, "grpo": 3e-4}
#: The batch size without a run to continue, or when the run's config.yaml names none.
_BATCH_SIZE = 8
#: Steps at each end of a run whose mean reward (GRPO) or loss (SFT) the summary shows.
_WINDOW = 5
#: transformers' deprecation of a keyword TRL passes on every step: nothing a user can change.
_TRL_INTERNALS = r".*gradient_checkpointing.*"


def tiny_model(tokenizer: Any) -> Any:
    """A one-layer, 32-wide ``LlamaForCausalLM`` over ``tokenizer``'s vocabulary (seed 0)."""
    import transformers

    transformers.set_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return transformers.LlamaForCausalLM(config)


@dataclass
class LightningRun:
    """A finished Lightning run of ``CausalLMModule``, as its checkpoint and config left it.

    TRL continues it with the run's own optimizer state, schedule, batch size and clipping: a
    fresh AdamW at the full learning rate moves every weight by about ``lr`` at its first step
    (after 300 steps of ``llm_sft`` that one step took TRL's loss from 0.43 to 2.24).
    """

    name: str
    step: int
    module: Any  # the run's CausalLMModule, its model given the checkpoint's weights
    optimizer_states: list[Any]
    scheduler_states: list[Any]
    batch_size: int
    max_grad_norm: float
    accumulation: int

    @property
    def model(self) -> Any:
        return self.module.model

    def optimizers(self) -> tuple[Any, Any]:
        """The run's optimizer and learning-rate schedule, restored as Lightning resumes them (a weights-only checkpoint: fresh ones, the warm-up included)."""
        import torch

        configured = self.module.configure_optimizers()
        if isinstance(configured, dict):
            optimizer = configured["optimizer"]
            scheduler = configured["lr_scheduler"]["scheduler"]
        else:  # no warm-up: the run's learning rate throughout
            optimizer = configured
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        if self.optimizer_states:
            optimizer.load_state_dict(self.optimizer_states[0])
        if self.scheduler_states and isinstance(configured, dict):
            scheduler.load_state_dict(self.scheduler_states[0])
        return optimizer, scheduler


def run_model(path: str) -> LightningRun:
    """The Lightning run of ``CausalLMModule`` at ``path`` (run directory, ``.ckpt`` or a config's directory of runs), rebuilt from its hyper-parameters and weights; nothing is unpickled."""
    import importlib

    import transformers
    import yaml

    from rb_lightning.buffers.reader import read_torch_file
    from rb_lightning.llm.module import CausalLMModule
    from rb_lightning.persist.run_dirs import checkpoint_path_of

    file = checkpoint_path_of(path)
    if file is None:
        raise SystemExit(
            f"error: --model {path}: no checkpoint there. Give a run directory of "
            "configs/llm_sft.yaml (runs/llm_sft/version_<N>) or its last.ckpt."
        )
    state = read_torch_file(file)  # tensors and plain data only: nothing unpickled
    # LightningCLI saved the module's transformers config as {class_path, init_args}.
    hparams = state.get("hyper_parameters", {})
    saved = hparams.get("config")
    config_class: Any = None
    if isinstance(saved, dict) and isinstance(saved.get("class_path"), str):
        module_name, _, class_name = saved["class_path"].rpartition(".")
        config_class = getattr(importlib.import_module(module_name), class_name, None)
    if not (
        isinstance(config_class, type) and issubclass(config_class, transformers.PretrainedConfig)
    ):
        raise SystemExit(
            f"error: --model {path}: {file} is not a run of a language model "
            "(rb_lightning.llm.module.CausalLMModule, as configs/llm_sft.yaml trains)."
        )
    config = config_class(**saved.get("init_args", {}))
    training = {k: hparams[k] for k in ("lr", "weight_decay", "warmup_steps") if k in hparams}
    module = CausalLMModule(config, **training)
    module.load_state_dict(state["state_dict"])
    # The run's config.yaml (LightningCLI writes it into the run directory) has the rest.
    run_dir = file.parent.parent if file.parent.name == "checkpoints" else file.parent
    cli: dict[str, Any] = {}
    if (run_dir / "config.yaml").is_file():
        cli = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    trainer = cli.get("trainer") or {}
    data = (cli.get("data") or {}).get("init_args") or {}
    clip = trainer.get("gradient_clip_val")
    batch_size = data.get("batch_size")
    return LightningRun(
        name=str(run_dir),
        step=int(state.get("global_step", 0)),
        module=module,
        optimizer_states=list(state.get("optimizer_states", [])),
        scheduler_states=list(state.get("lr_schedulers", [])),
        batch_size=batch_size if isinstance(batch_size, int) else _BATCH_SIZE,
        max_grad_norm=float(clip) if clip else 0.0,  # 0: TRL clips nothing, as the run
        accumulation=int(trainer.get("accumulate_grad_batches") or 1),
    )


def main(argv: list[str] | None = None) -> None:
    """Train each trainer named in ``argv`` on the export, in turn, from one model."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a folder written by rb-lightning-export-hf")
    parser.add_argument(
        "--model",
        help="a run of configs/llm_sft.yaml to continue: its directory or .ckpt, or "
        "runs/llm_sft (the newest run)",
    )
    parser.add_argument("--trainer", nargs="+", choices=["sft", "grpo"], default=["sft"])
    parser.add_argument("--max-steps", type=int, default=5)
    args = parser.parse_args(argv)
    import datasets

    from rb_lightning.runs.run_log import quiet_run_log

    quiet_run_log()
    datasets.disable_progress_bars()  # TRL's tokenizing passes over the export
    warnings.filterwarnings("ignore", message=_TRL_INTERNALS, category=FutureWarning)
    train_dataset = datasets.load_from_disk(args.dataset)
    tokenizer = make_tokenizer()
    run = None if args.model is None else run_model(args.model)
    model = tiny_model(tokenizer) if run is None else run.model
    # SFT goes on with the run's optimizer (one for every SFT trainer of the command).
    continuing = None if run is None else (run, run.optimizers())
    names = {"sft": "SFTTrainer", "grpo": "GRPOTrainer"}
    for name in args.trainer:
        sft_run = continuing if name == "sft" else None
        model, steps, logs = train(
            name, model, tokenizer, train_dataset, args.max_steps, continuing=sft_run
        )
        line = f"{names[name]}: {steps} steps on {train_dataset.num_rows:,} rows of {args.dataset}"
        rewards = [log["reward"] for log in logs if "reward" in log]
        if rewards:  # GRPO: the mean reward of the completions of the first and last steps
            line += ", mean reward of " + _ends(rewards)
        else:  # SFT: each step's loss is one batch's, so the ends' means show the trend
            losses = [log["loss"] for log in logs if "loss" in log]
            line += f", loss {losses[0]:.4f} -> {losses[-1]:.4f}, mean of " + _ends(losses)
            if sft_run is not None:
                line += (
                    f"; continued {sft_run[0].name} from step {sft_run[0].step:,} with its "
                    f"optimizer, learning rate and batch size ({sft_run[0].batch_size})"
                )
        print(line)


def _ends(values: list[float]) -> str:
    """``"the first 5 steps 0.625, of the last 5 0.750"``: means over both ends of a run."""
    window = min(_WINDOW, max(1, len(values) // 2))
    first, last = values[:window], values[-window:]
    return (
        f"the first {window} steps {sum(first) / window:.3f}, "
        f"of the last {window} {sum(last) / window:.3f}"
    )


def train(
    name: str,
    model: Any,
    tokenizer: Any,
    train_dataset: Any,
    max_steps: int,
    continuing: tuple[LightningRun, tuple[Any, Any]] | None = None,
) -> tuple[Any, int, list[dict[str, float]]]:
    """Train ``model`` with TRL trainer ``name``; return the model, its steps and step logs.

    ``continuing``: the Lightning run SFT goes on with, and its restored optimizer and
    schedule, so TRL trains as the run did instead of with its own defaults.
    """
    import transformers
    import trl

    common: dict[str, Any] = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-"),
        max_steps=max_steps,
        learning_rate=_LEARNING_RATES[name],
        per_device_train_batch_size=_BATCH_SIZE,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    optimizers: Any = (None, None)
    if continuing is not None:
        run, optimizers = continuing
        common.update(
            learning_rate=optimizers[0].param_groups[0]["lr"],  # shown in logs; the run's
            per_device_train_batch_size=run.batch_size,
            gradient_accumulation_steps=run.accumulation,
            max_grad_norm=run.max_grad_norm,
            bf16=False,  # the run trained in float32, and TRL would autocast to bfloat16
        )
    trainer: Any
    if name == "sft":  # reads prompt + completion: the loss is on the completion
        trainer = trl.SFTTrainer(
            model=model,
            args=trl.SFTConfig(**common, max_length=16),
            train_dataset=train_dataset,
            processing_class=tokenizer,
            optimizers=optimizers,
        )
    else:  # reads prompt; other columns reach the reward function as keyword lists
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=cast(Any, arithmetic_reward),  # TRL types rewards list[float | None]
            args=trl.GRPOConfig(**common, num_generations=4, max_completion_length=4),
            train_dataset=train_dataset,
            processing_class=tokenizer,
        )
    # Its bar and a dict of ~20 numbers per step; this script prints one line per trainer.
    trainer.remove_callback(transformers.trainer_callback.ProgressCallback)
    trainer.train()
    steps = [log for log in trainer.state.log_history if "loss" in log]  # not the final summary
    return trainer.model, trainer.state.global_step, steps


if __name__ == "__main__":
    main()

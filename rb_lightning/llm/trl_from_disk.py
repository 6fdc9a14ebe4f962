"""Train a TRL trainer on a ``datasets`` folder exported from a Lightning run.

    python train.py fit --config configs/llm_sft.yaml --trainer.max_steps 300
    rb-lightning-export-hf runs/llm_sft/version_0 sft_data --keys prompt completion
    python -m rb_lightning.llm.trl_from_disk sft_data --model runs/llm_sft/version_0 \
        --trainer sft grpo   # SFTTrainer, then GRPOTrainer, from the run's model

``--model`` names the Lightning run (or its ``.ckpt``) whose model TRL continues; without
it, a fresh tiny Llama (whose GRPO rewards stay 0: it never answers right). The tokenizer
is the configs' local character tokenizer; put your own model and tokenizer in their
place. The data is ``datasets.load_from_disk`` of the export, as any TRL script would
read it. ``datasets``, ``transformers`` and ``trl`` (the ``hf`` extra) are imported when
it runs.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from typing import Any, cast

from rb_lightning.llm.data import arithmetic_reward, make_tokenizer

#: The learning rates of configs/llm_sft.yaml and llm_grpo.yaml: TRL's defaults (2e-5, 1e-6)
#: are for large pretrained models and leave this tiny one where it was.
_LEARNING_RATES = {"sft": 3e-3, "grpo": 3e-4}
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


def run_model(path: str) -> Any:
    """The ``transformers`` model of a Lightning run of ``CausalLMModule`` (``llm_sft.yaml``).

    ``path`` is the run directory or its ``.ckpt``; the model is rebuilt from the
    config the module saved and given the checkpoint's weights.
    """
    import importlib

    import transformers

    from rb_lightning.buffers.reader import checkpoint_path_of, read_torch_file

    file = checkpoint_path_of(path)
    if file is None:
        raise SystemExit(
            f"error: --model {path}: no checkpoint there. Give a run directory of "
            "configs/llm_sft.yaml (runs/llm_sft/version_<N>) or its last.ckpt."
        )
    state = read_torch_file(file)  # tensors and plain data only: nothing unpickled
    # LightningCLI saved the module's transformers config as {class_path, init_args}.
    saved = state.get("hyper_parameters", {}).get("config")
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
    model = transformers.AutoModelForCausalLM.from_config(config)
    weights = {
        key.removeprefix("model."): value
        for key, value in state["state_dict"].items()
        if key.startswith("model.")
    }
    model.load_state_dict(weights)
    return model


def main(argv: list[str] | None = None) -> None:
    """Train each trainer named in ``argv`` on the export, in turn, from one model."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a folder written by rb-lightning-export-hf")
    parser.add_argument(
        "--model", help="a run of configs/llm_sft.yaml (its directory or .ckpt) to continue"
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
    model = tiny_model(tokenizer) if args.model is None else run_model(args.model)
    names = {"sft": "SFTTrainer", "grpo": "GRPOTrainer"}
    for name in args.trainer:
        model, steps, logs = train(name, model, tokenizer, train_dataset, args.max_steps)
        line = f"{names[name]}: {steps} steps on {train_dataset.num_rows:,} rows of {args.dataset}"
        rewards = [log["reward"] for log in logs if "reward" in log]
        if rewards:  # GRPO: the mean reward of the completions of the first and last steps
            line += ", mean reward of " + _ends(rewards)
        else:  # SFT: each step's loss is one batch's, so the ends' means show the trend
            losses = [log["loss"] for log in logs if "loss" in log]
            line += f", loss {losses[0]:.4f} -> {losses[-1]:.4f}, mean of " + _ends(losses)
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
    name: str, model: Any, tokenizer: Any, train_dataset: Any, max_steps: int
) -> tuple[Any, int, list[dict[str, float]]]:
    """Train ``model`` with TRL trainer ``name``; return the model, its steps and step logs."""
    import transformers
    import trl

    common: dict[str, Any] = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-"),
        max_steps=max_steps,
        learning_rate=_LEARNING_RATES[name],
        per_device_train_batch_size=8,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    trainer: Any
    if name == "sft":  # reads prompt + completion: the loss is on the completion
        trainer = trl.SFTTrainer(
            model=model,
            args=trl.SFTConfig(**common, max_length=16),
            train_dataset=train_dataset,
            processing_class=tokenizer,
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

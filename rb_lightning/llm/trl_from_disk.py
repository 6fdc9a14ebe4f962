"""Train a TRL trainer on a ``datasets`` folder exported from a Lightning run.

    python train.py fit --config configs/llm_sft.yaml
    rb-lightning-export-hf runs/llm_sft/version_0 sft_data --keys prompt completion
    python -m rb_lightning.llm.trl_from_disk sft_data                     # SFTTrainer
    python -m rb_lightning.llm.trl_from_disk sft_data --trainer sft grpo  # then GRPOTrainer

A tiny Llama over the config's local character tokenizer, on the CPU, so that it
runs in seconds; put your own model and tokenizer in their place. The data is
``datasets.load_from_disk`` of the export, as any TRL script would read it.
``datasets``, ``transformers`` and ``trl`` (the ``hf`` extra) are imported when it runs.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any, cast

from rb_lightning.llm.data import arithmetic_reward, make_tokenizer


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


def main(argv: list[str] | None = None) -> None:
    """Train each trainer named in ``argv`` on the export, in turn, from one model."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a folder written by rb-lightning-export-hf")
    parser.add_argument("--trainer", nargs="+", choices=["sft", "grpo"], default=["sft"])
    parser.add_argument("--max-steps", type=int, default=5)
    args = parser.parse_args(argv)
    import datasets

    train_dataset = datasets.load_from_disk(args.dataset)
    tokenizer = make_tokenizer()
    model = tiny_model(tokenizer)
    names = {"sft": "SFTTrainer", "grpo": "GRPOTrainer"}
    for name in args.trainer:
        model, steps, loss = train(name, model, tokenizer, train_dataset, args.max_steps)
        print(
            f"{names[name]}: {steps} steps on {train_dataset.num_rows:,} rows of {args.dataset}, "
            f"last loss {loss:.4f}"
        )


def train(
    name: str, model: Any, tokenizer: Any, train_dataset: Any, max_steps: int
) -> tuple[Any, int, float]:
    """Train ``model`` with TRL trainer ``name``; return the model, its steps and last loss."""
    import trl

    common: dict[str, Any] = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-"),
        max_steps=max_steps,
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
    trainer.train()
    loss = [log["loss"] for log in trainer.state.log_history if "loss" in log][-1]
    return trainer.model, trainer.state.global_step, float(loss)


if __name__ == "__main__":
    main()

"""GRPO on the arithmetic task: ``configs/llm_grpo.yaml`` against ``trl.GRPOTrainer``, side by side.

Both start from the same SFT checkpoint (``configs/llm_sft.yaml`` for ``--sft-steps``
steps, trained once by this script), train the same tiny Llama on prompts of the
same task (``"a+b="``, operands 0..50) with 8 completions per prompt, 8 prompts per
step, the same reward (:func:`rb_lightning.llm.data.arithmetic_reward`), learning
rate (3e-4, AdamW), clip 0.2, no KL, temperature 1.0, at most 4 new tokens, the same
number of optimizer steps and so the same number of generated completions. TRL runs
with ``loss_type="dapo"`` (its default: the token mean over the batch, as ours),
``num_iterations=1`` (on-policy, as ``max_staleness: 0``) and ``bf16=False``: float32,
as ours. ``GRPOConfig`` defaults to ``bf16=True``, which on a CPU too runs its generation
and its training forward under bfloat16 autocast (for this tiny Llama, log-probs up to
0.17 nats from float32's and a step's gradient 38% of its norm away); ``--trl-bf16``
runs TRL that way. Both clip the gradient norm at 1 (TRL's default ``max_grad_norm``,
``gradient_clip_val`` in ``llm_grpo.yaml``).

Rows:

- ``ours (on-policy)``: ``python train.py fit --config configs/llm_grpo.yaml
  --model.init_from <sft> --seed_everything <seed> --model.init_args.seed <seed>``.
- ``ours (replay)``: the same with ``max_staleness: --replay-staleness`` (default 2)
  and 4 prompts per step: each group stays in the sampled window for that many more
  policy versions, half as many completions are generated.
- ``trl``: ``trl.GRPOTrainer`` on a dataset of ``steps x 8`` prompts.

Columns: ``accuracy``: greedy accuracy on 256 held-out prompts (seed 1, the
``val_buffer`` of ``llm_grpo.yaml``), every model scored by the same function
(:meth:`rb_lightning.llm.grpo.GRPOModule.greedy_accuracy`); ``completions``:
generated completions; ``train (s)``: wall time of the training call alone
(``Trainer.fit`` / ``GRPOTrainer.train``), in this process, one torch thread each;
``cpu (s)``: the process's CPU time over the same call (less sensitive than wall time
to other load on a shared machine). Medians over the seeds.

Run from the repository root (an idle machine)::

    python benchmarks/grpo_vs_trl.py                      # seeds 0 1 2, 200 steps
    python benchmarks/grpo_vs_trl.py --seeds 0 --steps 20 # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rb_lightning.llm.data import arithmetic_examples, arithmetic_reward, make_tokenizer  # noqa: E402
from rb_lightning.llm.grpo import GRPOModule  # noqa: E402
from rb_lightning.runs.cli import main as cli_main  # noqa: E402

QUIET = [
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.val_check_interval=100000",
    "--trainer.callbacks=[]",
]
HELD_OUT = [prompt for prompt, _ in arithmetic_examples(256, seed=1)]


def _fit(config: str, args: list[str]) -> tuple[object, float, float]:
    cli = cli_main(["--config", config, *args], run=False)
    start, cpu = time.perf_counter(), time.process_time()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model, time.perf_counter() - start, time.process_time() - cpu


def train_sft(steps: int, root: Path) -> Path:
    """An SFT checkpoint of ``configs/llm_sft.yaml`` after ``steps`` steps."""
    model, _, _ = _fit(
        str(REPO / "configs" / "llm_sft.yaml"),
        [*QUIET, f"--trainer.max_steps={steps}", "--trainer.logger=false",
         "--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={root}"],
    )  # fmt: skip
    path = root / "sft.ckpt"
    torch.save({"state_dict": model.state_dict()}, path)
    return path


def accuracy_of(model: torch.nn.Module) -> float:
    """Greedy held-out accuracy of a causal LM, scored by GRPOModule.greedy_accuracy."""
    scorer = GRPOModule(_sft_config())
    scorer.model.load_state_dict(model.state_dict())
    scorer.eval()
    return float(scorer.greedy_accuracy(HELD_OUT))


def _sft_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=18, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=32, pad_token_id=0,
        bos_token_id=None, eos_token_id=1,
    )  # fmt: skip


def run_ours(
    sft: Path, seed: int, steps: int, root: Path, replay_staleness: int | None
) -> dict[str, float]:
    args = [
        *QUIET, f"--trainer.max_steps={steps}", "--trainer.logger=false",
        "--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={root}",
        f"--model.init_from={sft}", f"--seed_everything={seed}", f"--model.init_args.seed={seed}",
    ]  # fmt: skip
    prompts = 8
    if replay_staleness is not None:
        prompts = 4
        args += [
            "--data.init_args.replay_buffer.init_args.sampler.init_args.max_staleness="
            f"{replay_staleness}",
            "--model.init_args.prompts_per_step=4",
        ]
    model, seconds, cpu = _fit(str(REPO / "configs" / "llm_grpo.yaml"), args)
    return {
        "accuracy": float(model.greedy_accuracy(HELD_OUT)),
        "completions": steps * prompts * 8,
        "train (s)": seconds,
        "cpu (s)": cpu,
    }


def run_trl(sft: Path, seed: int, steps: int, root: Path, bf16: bool = False) -> dict[str, float]:
    import datasets
    import trl

    model = _loaded(sft)
    prompts = [p for p, _ in arithmetic_examples(steps * 8, seed=1000 + seed)]
    config = trl.GRPOConfig(
        output_dir=str(root / "trl"), max_steps=steps, per_device_train_batch_size=64,
        num_generations=8, max_completion_length=4, learning_rate=3e-4, lr_scheduler_type="constant",
        weight_decay=0.0, warmup_steps=0, epsilon=0.2, beta=0.0, temperature=1.0,
        loss_type="dapo", num_iterations=1, seed=seed, report_to=[], use_cpu=True,
        save_strategy="no", logging_steps=steps, dataloader_num_workers=0,
        disable_tqdm=True, bf16=bf16,
    )  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=arithmetic_reward, args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
        processing_class=make_tokenizer(),
    )  # fmt: skip
    start, cpu = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "accuracy": accuracy_of(trainer.model),
        "completions": steps * 64,
        "train (s)": seconds,
        "cpu (s)": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument(
        "--replay-staleness", type=int, default=2, help="max_staleness of the replay row"
    )
    parser.add_argument(
        "--trl-bf16", action="store_true", help="run TRL under bfloat16 autocast (its default)"
    )
    options = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sft = train_sft(options.sft_steps, root / "sft")
        start = accuracy_of(_loaded(sft))
        rows: dict[str, list[dict[str, float]]] = {
            "ours (on-policy)": [],
            "ours (replay)": [],  # max_staleness --replay-staleness
            "trl": [],
        }
        for seed in options.seeds:
            rows["ours (on-policy)"].append(
                run_ours(sft, seed, options.steps, root / f"a{seed}", None)
            )
            rows["ours (replay)"].append(
                run_ours(sft, seed, options.steps, root / f"b{seed}", options.replay_staleness)
            )
            rows["trl"].append(
                run_trl(sft, seed, options.steps, root / f"t{seed}", options.trl_bf16)
            )
            for name, results in rows.items():
                print(f"seed {seed} {name}: {results[-1]}", flush=True)
    print(f"\nSFT start ({options.sft_steps} steps): held-out greedy accuracy {start:.3f}")
    precision = "bfloat16 autocast" if options.trl_bf16 else "float32"
    print(f"{options.steps} GRPO steps, seeds {options.seeds}, TRL in {precision}, medians:\n")
    print("| run | accuracy | completions | train (s) | cpu (s) |")
    print("|---|---|---|---|---|")
    for name, results in rows.items():
        cells = [
            statistics.median(r[c] for r in results)
            for c in ("accuracy", "completions", "train (s)", "cpu (s)")
        ]
        print(f"| {name} | {cells[0]:.3f} | {cells[1]:,.0f} | {cells[2]:.1f} | {cells[3]:.1f} |")


def _loaded(sft: Path) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(_sft_config())
    state = torch.load(sft, weights_only=False)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    return model


if __name__ == "__main__":
    main()

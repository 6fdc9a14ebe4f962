"""One process of a multi-process TRL run streaming from a replay buffer (launched by a test).

``python -m torch.distributed.run --nproc_per_node 2 trl_ranks_worker.py TRAINER RANKS DUMP OUT``

Every process loads the same buffer dump (``load_buffer``), exports it with
``to_hf_dataset(ranks=RANKS)`` and trains ``TRAINER`` (``grpo`` or ``sft``) for
a few steps on a tiny offline model. What each process actually trained on is
written to ``OUT/rank<R>.jsonl``, one line per step, for the test to check:
GRPO from the reward function (prompt ids of the local completions, in
order), SFT from ``training_step`` (the decoded rows of the local batch).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import trl
from tiny_llm import tiny_model
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.buffers.reader import load_buffer
from rb_lightning.hf.export import to_hf_dataset
from rb_lightning.llm.data import (
    arithmetic_examples,
    arithmetic_reward,
    arithmetic_tensordict,
    make_tokenizer,
)

STEPS = 2
SEED = 5  # the stream's seed: the same on every process
GRPO_BATCH = 3  # per process; with NUM_GENERATIONS=2 one group spans the two processes
NUM_GENERATIONS = 2
SFT_BATCH = 4


def make_buffer(capacity: int = 64) -> ReplayBuffer:
    """The buffer the test dumps and every process loads into (a RandomSampler)."""
    return ReplayBuffer(storage=LazyTensorStorage(capacity))


def fill(rb: ReplayBuffer, n: int = 64) -> ReplayBuffer:
    """``n`` arithmetic items with a unique ``id`` column (to tell repeated prompts apart)."""
    items = arithmetic_tensordict(arithmetic_examples(n, seed=0), make_tokenizer())
    items["id"] = torch.arange(n)
    rb.extend(items)
    return rb


def common_args(out: Path) -> dict:
    return dict(
        output_dir=str(out / "trainer"),
        max_steps=STEPS,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
        seed=0,
    )


def main(trainer_name: str, ranks: str, dump: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    rank = int(os.environ.get("RANK", "0"))
    log = open(out / f"rank{rank}.jsonl", "a")  # noqa: SIM115 - closed at exit

    def record(**entry) -> None:
        log.write(json.dumps({"rank": rank, **entry}) + "\n")
        log.flush()

    rb = make_buffer()
    load_buffer(rb, dump)  # the same content on every process
    record(buffer=[int(i) for i in rb[: len(rb)]["id"]], prompts=list(rb[: len(rb)]["prompt"]))
    tokenizer = make_tokenizer()
    stream = to_hf_dataset(
        rb,
        keys=["prompt", "completion", "id"],
        batch_size=8,
        num_batches=None,
        ranks=ranks,
        **({"seed": SEED} if ranks == "identical" else {}),
    )
    if trainer_name == "grpo":

        def reward(completions, prompts, id, trainer_state, **kwargs):  # noqa: A002 - TRL's column
            record(step=trainer_state.global_step, ids=[int(i) for i in id], prompts=prompts)
            return arithmetic_reward(completions, prompts=prompts)

        trainer = trl.GRPOTrainer(
            model=tiny_model(tokenizer),
            reward_funcs=reward,
            args=trl.GRPOConfig(
                **common_args(out),
                per_device_train_batch_size=GRPO_BATCH,
                num_generations=NUM_GENERATIONS,
                max_completion_length=3,
            ),
            train_dataset=stream.select_columns(["prompt", "id"]),
            processing_class=tokenizer,
        )
    else:

        class LoggingSFTTrainer(trl.SFTTrainer):
            def training_step(self, model, inputs, *args, **kwargs):
                rows = tokenizer.batch_decode(inputs["input_ids"], skip_special_tokens=True)
                record(step=self.state.global_step, rows=rows)
                return super().training_step(model, inputs, *args, **kwargs)

        trainer = LoggingSFTTrainer(
            model=tiny_model(tokenizer),
            args=trl.SFTConfig(
                **common_args(out), per_device_train_batch_size=SFT_BATCH, max_length=16
            ),
            train_dataset=stream.select_columns(["prompt", "completion"]),
            processing_class=tokenizer,
        )
    trainer.train()
    record(done=trainer.state.global_step, world_size=trainer.accelerator.num_processes)


if __name__ == "__main__":
    main(*sys.argv[1:5])

"""Real 2-process TRL runs (torchrun, gloo, CPU) streaming from one replay buffer dump.

Each test launches ``trl_ranks_worker.py`` on two processes under a hard
timeout and checks what every process actually trained on (its per-rank log):
GRPO groups hold one prompt although a group spans the two processes, SFT
processes take disjoint slices of each global batch of the one stream every
process draws, and a per-rank random stream under GRPO is refused.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
pytest.importorskip("transformers")

import trl_ranks_worker as worker  # noqa: E402

from rb_lightning.buffers.reader import load_buffer  # noqa: E402
from rb_lightning.hf.export import to_hf_dataset  # noqa: E402
from rb_lightning.persist.dumps import dump_buffer  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.slow]

WORKER = Path(worker.__file__)
TIMEOUT_S = 240  # two ~30 s runs on 2 CPU cores; a hang fails here instead of blocking CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(trainer: str, ranks: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list]:
    """Run the worker on 2 processes; return the result and each rank's log entries."""
    dump = tmp_path / "buffer"
    if not dump.exists():
        dump_buffer(worker.fill(worker.make_buffer()), dump)
    out = tmp_path / f"{trainer}-{ranks}"
    out.mkdir()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(WORKER), trainer, ranks, str(dump), str(out),
    ]  # fmt: skip
    try:
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as err:  # pragma: no cover - the failure being guarded
        pytest.fail(f"{trainer} on 2 processes hung for {TIMEOUT_S}s:\n{err.stderr}")
    logs = []
    for rank in (0, 1):
        path = out / f"rank{rank}.jsonl"
        logs.append([json.loads(line) for line in path.read_text().splitlines()])
    return result, logs


def steps(log: list[dict]) -> list[dict]:
    return [entry for entry in log if "step" in entry]


def check_same_buffer(logs: list[list[dict]]) -> None:
    reference = worker.fill(worker.make_buffer())
    ids = [int(i) for i in reference[:64]["id"]]
    for log in logs:
        assert log[0]["buffer"] == ids
        assert log[0]["prompts"] == list(reference[:64]["prompt"])


def test_grpo_on_two_processes_keeps_every_group_on_one_prompt(tmp_path):
    result, logs = launch("grpo", "identical", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    check_same_buffer(logs)
    for log in logs:
        assert log[-1] == {"rank": log[0]["rank"], "done": worker.STEPS, "world_size": 2}
    per_rank = [steps(log) for log in logs]
    assert [len(s) for s in per_rank] == [worker.STEPS, worker.STEPS]
    k = worker.NUM_GENERATIONS
    for mine, theirs in zip(*per_rank, strict=True):
        assert mine["step"] == theirs["step"]
        # The global batch is rank 0's slice then rank 1's (Accelerate's IterableDatasetShard).
        ids = mine["ids"] + theirs["ids"]
        prompts = mine["prompts"] + theirs["prompts"]
        assert len(ids) == 2 * worker.GRPO_BATCH
        groups = [(ids[i : i + k], prompts[i : i + k]) for i in range(0, len(ids), k)]
        for group_ids, group_prompts in groups:
            assert len(set(group_ids)) == 1 and len(set(group_prompts)) == 1, groups
        # Disjoint slices: one group spans the two processes, the others are each one's own.
        assert mine["ids"][-1] == theirs["ids"][0]
        assert not set(mine["ids"][:-1]) & set(theirs["ids"][1:])


def test_sft_on_two_processes_takes_disjoint_slices_of_one_stream(tmp_path):
    result, logs = launch("sft", "identical", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    check_same_buffer(logs)
    seen = [[entry["rows"] for entry in steps(log)] for log in logs]
    assert [len(s) for s in seen] == [worker.STEPS, worker.STEPS]
    # The stream every process drew, rebuilt here from the same dump and seed. SFTTrainer
    # peeks at the dataset before training (4 times with trl 1.16) and each iteration is a
    # new pass, seeded by its number: find the pass it trained on.
    rb = worker.make_buffer()
    load_buffer(rb, tmp_path / "buffer")
    stream = to_hf_dataset(
        rb, keys=["prompt", "completion"], batch_size=8, num_batches=None, seed=worker.SEED
    )
    global_batch = 2 * worker.SFT_BATCH
    rows = global_batch * worker.STEPS
    passes = [[r["prompt"] + r["completion"] for r in stream.take(rows)] for _ in range(8)]
    matching = [
        p
        for p, expected in enumerate(passes)
        if all(
            seen[rank][step]
            == expected[step * global_batch + rank * worker.SFT_BATCH :][: worker.SFT_BATCH]
            for rank in (0, 1)
            for step in range(worker.STEPS)
        )
    ]
    # Each process took its own positions of each global batch (the content may repeat:
    # the buffer samples with replacement).
    assert len(matching) == 1, (seen, passes)

"""GRPO on a user's own task, as docs/llm.md shows it: that page's module and config, run.

Through ``train.py`` (what the user types), with the page's ``reverse_task.py`` next to the
config: the reward rises, the export's text is what the run's tokenizer decodes and the reward
sees, and ``trl.GRPOTrainer`` continues from the exported prompts with the same reward.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from grpo_probe import column, metrics
from run_output import unexpected_lines

pytestmark = pytest.mark.hf
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from hf.tiny_llm import tiny_model  # noqa: E402  (imports transformers)

from rb_lightning import to_hf_dataset  # noqa: E402
from rb_lightning.llm.data import make_tokenizer  # noqa: E402
from rb_lightning.llm.pairs import with_text  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "llm.md"


def _page_files(folder: Path) -> None:
    text = PAGE.read_text().split("## GRPO on your own task", 1)[1].split("\n## ", 1)[0]
    (module,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "reverse_task.py" in b]
    (config,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    (folder / "reverse_task.py").write_text(module)
    assert yaml.safe_load(config)["model"]["init_args"]["task"]  # the task is in the config
    (folder / "reverse.yaml").write_text(config)


def test_the_pages_task_trains_exports_and_continues_in_trl(tmp_path):
    _page_files(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "fit", "--config", "reverse.yaml",
         "--trainer.max_steps=60", "--trainer.log_every_n_steps=1",
         "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # Only what a user reads (before: jsonargparse warned it could not serialize the
    # "module:function" paths, and Lightning that validation_step had no loader).
    assert unexpected_lines(done.stdout + done.stderr) == []
    run = tmp_path / "runs" / "reverse" / "version_0"
    rewards = list(column(metrics(run), "reward_mean").values())
    assert len(rewards) == 60
    first, last = sum(rewards[:15]) / 15, sum(rewards[-15:]) / 15
    assert last > first + 0.02, (first, last)

    sys.path.insert(0, str(tmp_path))
    try:
        import reverse_task
    finally:
        sys.path.remove(str(tmp_path))
    keys = ["input_ids", "attention_mask", "completion_mask", "reward", "group"]
    rows = with_text(to_hf_dataset(run, streaming=False, keys=keys), make_tokenizer())
    assert all(re.fullmatch(r"\d{3}=", row["prompt"]) for row in rows)
    # The stored reward is the reward of the text the tokenizer decodes from the stored ids.
    recomputed = reverse_task.reversed_digits(
        [r["completion"] for r in rows], [r["prompt"] for r in rows]
    )
    assert [r["reward"] for r in rows] == pytest.approx(recomputed, abs=1e-6)

    tokenizer = make_tokenizer()
    prompts = datasets.Dataset.from_list([{"prompt": r["prompt"]} for r in rows[::8][:16]])
    trainer = trl.GRPOTrainer(
        model=tiny_model(tokenizer), reward_funcs=reverse_task.reversed_digits,
        processing_class=tokenizer, train_dataset=prompts,
        args=trl.GRPOConfig(
            output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=4,
            learning_rate=1e-2, report_to=[], use_cpu=True, save_strategy="no",
            dataloader_num_workers=0, num_generations=2, max_completion_length=4,
        ),
    )  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 1

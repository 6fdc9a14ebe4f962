"""What a user may read from a run or a helper script: an allow-list of line patterns.

A line that matches none of them (a library's INFO line, a deprecation warning, an
advertisement, a stale progress bar, a warning about our own settings) is noise, and the
tests that run commands as a user types them fail on it: ``unexpected_lines(output)``.
"""

from __future__ import annotations

import re

ALLOWED = [
    # fit's start and end
    r"fit: (resuming|extending the finished run) runs/\S+ from step [\d,]+.*",
    r"(validate|test): the model of \S+\.ckpt \(step [\d,]+\)",
    r"(validate|test): \d+ episodes without exploration, environment seeds [\d,]+-[\d,]+",
    r"fit stopped at step [\d,]+ after [\d.]+ s: .*",
    r"Ray cluster at \S+: (buffer actor \S+|\d+ buffer shard actors \S+)",
    r"  \S.* \| .*|  (episode_return|val_loss|train_loss|loss|val_accuracy|reward_mean|frames) \S+",
    r"  (checkpoint|metrics|curves|resume) +\S.*",
    # Lightning's model summary (without FLOPs)
    r"  \| Name +\| Type +\|(?!.*FLOPs).*",
    r"\d+ +\| \S.*",
    r"-+",
    r"[\d.]+( [KMB])? +((Trainable|Non-trainable|Total) params|Total estimated model params size \(MB\))",
    r"\d+ +Modules in (train|eval) mode",
    # Lightning's metrics table (validate / test)
    r"[┏┃┡│└].*",
    # progress bars with a known total (one line per refresh once \r is read as a line break)
    r"(step|Validation DataLoader 0|Testing DataLoader 0|Epoch \d+): +\d+%.*",
    # the training progress in a file or a pipe: a plain line every ~10 s
    r"step [\d,]+/[\d,]+ \(\d+%\) \| [\d.]+ steps/s( \| .*)?",
    # real warnings: about the run's own settings
    r"GRPO starts from scratch: random weights, .*",
    # the helper scripts' results
    r"saved \d+ items \(capacity \d+\) to \S+",
    r"saved \d+ transitions \(capacity \d+\) to \S+; \d+ finished episodes, mean return \S+",
    r"(SFTTrainer|GRPOTrainer): \d+ steps on [\d,]+ rows of \S+, .*",
]
ALLOWED_LINE = re.compile("|".join(f"(?:{pattern})" for pattern in ALLOWED))


def unexpected_lines(output: str) -> list[str]:
    """The non-blank lines of ``output`` that match no allowed pattern."""
    lines = [line.rstrip() for line in output.replace("\r", "\n").splitlines()]
    return [line for line in lines if line.strip() and not ALLOWED_LINE.fullmatch(line)]

"""Smoke test of benchmarks/throughput.py: every path runs and yields batches of the right shape.

No timing assertions: speed is measured by running the benchmark itself.
"""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "throughput.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("rb_lightning_bench_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_path_yields_full_batches_and_the_report_runs(bench, tmp_path):
    batch_size, batches = 8, 3
    expected = {"llm": (batch_size, 512), "rl": (batch_size, 17), "atari": (batch_size, 4, 84, 84)}
    for item, storage in (("llm", "list"), ("rl", "memmap"), ("atari", "tensor")):
        shape = bench.Shape(item, storage, "prioritized", batch_size, 32)
        rb = bench.build_buffer(shape, str(tmp_path))
        assert len(rb) == 32
        for path, factory in bench.PATH_FACTORIES.items():
            got = list(itertools.islice(factory(rb, batch_size), batches))
            if path == "raw_info":
                got = [batch for batch, _info in got]
            assert len(got) == batches, path
            shapes = {tuple(batch[bench.FEATURE_KEY[item]].shape) for batch in got}
            assert shapes == {expected[item]}, (item, path, shapes)

    shape = bench.Shape("rl", "tensor", "random", batch_size, 32)
    rb = bench.build_buffer(shape, str(tmp_path))
    model = bench.TinyModel("obs")
    model.record_shapes = True
    clock = bench.fit_steps(rb, "rl", batch_size, steps=batches, warmup=1, model=model)
    assert clock.steps == batches and clock.rate > 0 and clock.gap_rate > 0
    assert model.seen_shapes == [(batch_size, 17)] * (batches + 1)

    peak = bench.rss_child({"shape": shape.__dict__, "path": "batch", "batches": batches})
    scaled = bench.scaling_child(
        {"shape": shape.__dict__, "repeats": 1, "min_seconds": 0.0, "scratch": str(tmp_path)}
    )
    assert scaled["size"] == 32 and scaled["raw"] > 0 and scaled["batch"] > 0
    assert peak["growth_mb"] >= 0 and peak["batch_mb"] == pytest.approx(
        8 * ((17 + 6 + 1) * 4 + 1) / 2**20
    )

    report = bench.main(["--smoke", "--scratch", str(tmp_path)])
    for heading in ("### Loaders", "### Inside `Trainer.fit`"):
        assert heading in report
    assert "| rl / tensor / prioritized / 8 |" in report


def test_only_keeps_the_named_rows_and_rejects_a_label_no_shape_has(bench, tmp_path, capsys):
    report = bench.main(["--smoke", "--only", "rl / tensor / random", "--scratch", str(tmp_path)])
    assert "### Inside `Trainer.fit`" in report
    assert "### Loaders" in report and "| rl / tensor / prioritized / 8 |" not in report

    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--smoke", "--only", "atari / list", "--scratch", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--only" in err and "its labels are 'rl / tensor / prioritized / 8'" in err


def test_loop_overhead_benchmark_runs_every_path(tmp_path):
    script = SCRIPT.parent / "loop_overhead.py"
    command = [sys.executable, str(script), "--steps", "20", "--repeats", "1"]
    command += ["--batches-per-draw", "4"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for row in ("pre_sampled", "fixed_sample", "datamodule (real", "batches_per_draw=4"):
        assert row in result.stdout, (row, result.stdout)

"""Command-line entry point: ``python train.py fit --config configs/<run>.yaml``."""

import gc
import sys

# Light (imports nothing heavy): Ctrl-C during the imports below ends in one line, exit 130.
from rb_lightning.runs.startup import stop_at_once_on_ctrl_c

stop_at_once_on_ctrl_c()

if __name__ == "__main__":
    # --help, `configs` and mistakes in the files and keys typed: answered before torch is
    # imported (seconds). Not in a worker process that imports this file as __mp_main__.
    from rb_lightning.runs.console import answer_early

    answer_early(sys.argv[1:])

# Importing torch, Lightning and torchrl creates ~600k long-lived objects, and the cyclic
# garbage collector would walk them all about 8 times on the way (a one-step run's wall
# time: 8.7 s with it, 5.6 s without).
# Nothing an import makes is garbage: collect nothing until the imports are done, then
# freeze those objects out of every later collection.
gc.disable()
from rb_lightning.runs.cli import main  # noqa: E402

gc.freeze()
gc.enable()

if __name__ == "__main__":
    main()

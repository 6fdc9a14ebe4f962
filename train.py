"""Command-line entry point: ``python train.py fit --config configs/<run>.yaml``."""

import gc

# Light (imports nothing heavy): Ctrl-C during the imports below ends in one line, exit 130.
from rb_lightning.runs.startup import stop_at_once_on_ctrl_c

stop_at_once_on_ctrl_c()

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

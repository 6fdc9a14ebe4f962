"""Command-line entry point: ``python train.py fit --config configs/<run>.yaml``."""

from rb_lightning.cli import main

if __name__ == "__main__":
    main()

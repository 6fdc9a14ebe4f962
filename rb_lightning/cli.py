"""LightningCLI entry point for rb_lightning runs."""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI


def main(args: list[str] | None = None) -> LightningCLI:
    """Run ``LightningCLI`` with any LightningModule / LightningDataModule by ``class_path``."""
    return LightningCLI(
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args,
        save_config_kwargs={"overwrite": True},
    )


def console_main() -> None:
    """``rb-lightning`` console script."""
    main()

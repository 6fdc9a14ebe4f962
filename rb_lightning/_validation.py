"""Compatibility alias of :mod:`rb_lightning.validation` (renamed from ``_validation``); import that instead.

Kept so modules of parallel branches that still import ``rb_lightning._validation`` work; remove
once nothing imports it.
"""

from rb_lightning.validation import *  # noqa: F403
from rb_lightning.validation import __all__  # noqa: F401

"""Compatibility alias of :mod:`rb_lightning.sharding` (renamed from ``_sharding``); import that instead.

Kept so modules of parallel branches that still import ``rb_lightning._sharding`` work; remove
once nothing imports it.
"""

from rb_lightning.sharding import *  # noqa: F403
from rb_lightning.sharding import __all__  # noqa: F401

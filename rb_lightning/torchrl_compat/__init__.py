"""Every use of torchrl's and tensordict's private names or undocumented behaviour.

Written for torchrl 0.14.1 and tensordict 0.14.3 (the pinned versions); moving the pin means
re-checking this package. :mod:`~rb_lightning.torchrl_compat.workarounds` holds the fixes of
torchrl bugs, each naming the test that fails once a release fixes it (then delete the fix);
:mod:`~rb_lightning.torchrl_compat.internals` the features built on private attributes, and
:mod:`~rb_lightning.torchrl_compat.dumps_layout` the reading of ``dumps``' files. No other
module touches a torchrl ``_private`` name (``tests/unit/test_private_names.py``).
"""

from rb_lightning.torchrl_compat import dumps_layout, internals, workarounds
from rb_lightning.torchrl_compat.dumps_layout import *  # noqa: F403
from rb_lightning.torchrl_compat.internals import *  # noqa: F403
from rb_lightning.torchrl_compat.workarounds import *  # noqa: F403

__all__ = [*dumps_layout.__all__, *internals.__all__, *workarounds.__all__]

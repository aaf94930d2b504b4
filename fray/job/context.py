"""marin's ``fray.job.context``: the same names as :mod:`fray.job`, the job contexts (``SyncContext``,
``ThreadContext``, ``RayContext``, ``create_job_ctx``, ``fray_job_ctx``) on Fray.

>>> from fray.job import create_job_ctx
>>> ctx = create_job_ctx("sync")
>>> ctx.get(ctx.run(len, "abc"))
3
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fray._names import JOB
from fray_core._lazy import lazy_exports

if TYPE_CHECKING:
    from fray_core import *  # noqa: F403

__all__ = sorted(JOB)

__getattr__, __dir__ = lazy_exports(__name__, JOB, __all__)

# marin's tests import this private helper by name
from fray_core.context import apply_default_jax_platforms as _apply_default_jax_platforms  # noqa: E402, F401

"""marin's ``fray.cluster.ray.tpu`` (levanter's ``run_on_pod`` family, copied into marin): Fray's
:mod:`fray_core.compat.levanter`, with levanter's errors and preemption rules.

>>> from fray.cluster.ray.tpu import run_on_pod_resumable  # doctest: +SKIP
"""

from __future__ import annotations

from fray_core.compat.levanter import (
    run_on_pod,
    run_on_pod_multislice,
    run_on_pod_multislice_resumable,
    run_on_pod_resumable,
)

__all__ = ["run_on_pod", "run_on_pod_multislice", "run_on_pod_multislice_resumable", "run_on_pod_resumable"]

"""The request and status types, under their older home: a re-export of :mod:`fray_core.request` (what a
caller builds: :class:`JobRequest`, :class:`ResourceConfig`, the device configs, :class:`Entrypoint`,
:class:`EnvironmentConfig`, ...) and :mod:`fray_core.status` (what the cluster reports: :class:`JobStatus`,
:class:`JobInfo`, :class:`Attempt`, :class:`AttemptOutcome`, :class:`TaskStatus`, ...). Every name keeps
its old import path; new code imports from the module of its concern.

>>> from fray_core.types import JobRequest, JobInfo
>>> JobRequest.__module__, JobInfo.__module__
('fray_core.request', 'fray_core.status')
"""

from __future__ import annotations

from fray_core.request import (
    MAX_SIZE,
    CpuConfig,
    DeviceConfig,
    ElasticConfig,
    Entrypoint,
    EnvironmentConfig,
    GpuConfig,
    JobRequest,
    ResourceConfig,
    TpuConfig,
    create_environment,
    format_size,
    parse_size,
)
from fray_core.status import (
    Attempt,
    AttemptOutcome,
    Goodput,
    JobId,
    JobInfo,
    JobStatus,
    StoredResult,
    TaskStatus,
    summarize_request,
)

__all__ = [
    "MAX_SIZE",
    "Attempt",
    "AttemptOutcome",
    "CpuConfig",
    "DeviceConfig",
    "ElasticConfig",
    "Entrypoint",
    "EnvironmentConfig",
    "GpuConfig",
    "Goodput",
    "JobId",
    "JobInfo",
    "JobRequest",
    "JobStatus",
    "ResourceConfig",
    "StoredResult",
    "TaskStatus",
    "TpuConfig",
    "create_environment",
    "format_size",
    "parse_size",
    "summarize_request",
]

"""Fray core: backend-neutral job types, the TPU catalog, the Cluster contract and the gang runner.

    from fray_core import JobRequest, ResourceConfig, TpuConfig, Entrypoint, current_cluster

    cluster = current_cluster()                       # LocalCluster() unless configured otherwise
    job_id = cluster.launch(JobRequest(
        name="train", entrypoint=Entrypoint(callable=train),
        resources=ResourceConfig(device=TpuConfig(type="v4-16"), replicas=2)))
    info = cluster.wait(job_id)

This package never imports ray.
"""

from __future__ import annotations

from fray_core.cluster import (
    Cluster,
    cluster_from_spec,
    current_cluster,
    parse_spec,
    register_backend,
    set_current_cluster,
    using_cluster,
)
from fray_core.context import JobContext, fray_job_ctx
from fray_core.errors import (
    FrayError,
    JobFailedError,
    JobNotFoundError,
    UnknownBackendError,
    Unschedulable,
    WaitTimeoutError,
)
from fray_core.tpu import TPU_CATALOG, TpuSpec, get_tpu_spec, tpu_types
from fray_core.types import (
    Attempt,
    AttemptOutcome,
    CpuConfig,
    DeviceConfig,
    Entrypoint,
    EnvironmentConfig,
    GpuConfig,
    JobId,
    JobInfo,
    JobRequest,
    JobStatus,
    ResourceConfig,
    TpuConfig,
    create_environment,
    parse_size,
)

__all__ = [
    "TPU_CATALOG",
    "Attempt",
    "AttemptOutcome",
    "Cluster",
    "CpuConfig",
    "DeviceConfig",
    "Entrypoint",
    "EnvironmentConfig",
    "FrayError",
    "GpuConfig",
    "JobContext",
    "JobFailedError",
    "JobId",
    "JobInfo",
    "JobNotFoundError",
    "JobRequest",
    "JobStatus",
    "ResourceConfig",
    "TpuConfig",
    "TpuSpec",
    "UnknownBackendError",
    "Unschedulable",
    "WaitTimeoutError",
    "cluster_from_spec",
    "create_environment",
    "current_cluster",
    "fray_job_ctx",
    "get_tpu_spec",
    "parse_size",
    "parse_spec",
    "register_backend",
    "set_current_cluster",
    "tpu_types",
    "using_cluster",
]

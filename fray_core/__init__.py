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

from typing import TYPE_CHECKING

from fray_core._lazy import lazy_exports

# Submodules load on first use (PEP 562), so `import fray_core` costs almost nothing and never imports ray.
_LAZY: dict[str, str] = {
    "Attempt": "fray_core.status",
    "AttemptOutcome": "fray_core.status",
    "Cluster": "fray_core.cluster",
    "CpuConfig": "fray_core.request",
    "DeviceConfig": "fray_core.request",
    "ElasticConfig": "fray_core.request",
    "Entrypoint": "fray_core.request",
    "EnvironmentConfig": "fray_core.request",
    "FrayError": "fray_core.errors",
    "HostPreempted": "fray_core.errors",
    "GpuConfig": "fray_core.request",
    "Goodput": "fray_core.status",
    "JobContext": "fray_core.context",
    "SyncContext": "fray_core.context",
    "ThreadContext": "fray_core.context",
    "fray_default_job_ctx": "fray_core.context",
    "create_job_ctx": "fray_core.cluster",
    "get_default_job_ctx": "fray_core.cluster",
    "LoggingMonitorView": "fray_core.cluster",
    "TaskStatus": "fray_core.status",
    "JobFailedError": "fray_core.errors",
    "JobId": "fray_core.status",
    "JobInfo": "fray_core.status",
    "JobNotFoundError": "fray_core.errors",
    "JobRequest": "fray_core.request",
    "JobStatus": "fray_core.status",
    "ResourceConfig": "fray_core.request",
    "TPU_CATALOG": "fray_core.tpu",
    "TpuConfig": "fray_core.request",
    "TpuSpec": "fray_core.tpu",
    "UnknownBackendError": "fray_core.errors",
    "Unschedulable": "fray_core.errors",
    "WaitTimeoutError": "fray_core.errors",
    "cluster_from_spec": "fray_core.cluster",
    "create_environment": "fray_core.request",
    "current_cluster": "fray_core.cluster",
    "fray_job_ctx": "fray_core.cluster",
    "get_tpu_spec": "fray_core.tpu",
    "heartbeat": "fray_core.hostapi",
    "job": "fray_core.decorator",
    "worker_state": "fray_core.session",
    "Session": "fray_core.session",
    "RemoteCallError": "fray_core.session",
    "JobFunction": "fray_core.decorator",
    "parse_size": "fray_core.request",
    "parse_spec": "fray_core.cluster",
    "preemption_notice": "fray_core.hostapi",
    "register_backend": "fray_core.cluster",
    "set_current_cluster": "fray_core.cluster",
    "tpu_types": "fray_core.tpu",
    "using_cluster": "fray_core.cluster",
}

if TYPE_CHECKING:
    from fray_core.cluster import (
        Cluster,
        LoggingMonitorView,
        cluster_from_spec,
        create_job_ctx,
        current_cluster,
        fray_job_ctx,
        get_default_job_ctx,
        parse_spec,
        register_backend,
        set_current_cluster,
        using_cluster,
    )
    from fray_core.context import JobContext, SyncContext, ThreadContext, fray_default_job_ctx
    from fray_core.decorator import JobFunction, job
    from fray_core.errors import (
        FrayError,
        HostPreempted,
        JobFailedError,
        JobNotFoundError,
        UnknownBackendError,
        Unschedulable,
        WaitTimeoutError,
    )
    from fray_core.hostapi import heartbeat, preemption_notice
    from fray_core.request import (
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
        parse_size,
    )
    from fray_core.session import RemoteCallError, Session, worker_state
    from fray_core.status import Attempt, AttemptOutcome, Goodput, JobId, JobInfo, JobStatus, TaskStatus
    from fray_core.tpu import TPU_CATALOG, TpuSpec, get_tpu_spec, tpu_types

__all__ = [
    "TPU_CATALOG",
    "Attempt",
    "AttemptOutcome",
    "Cluster",
    "CpuConfig",
    "DeviceConfig",
    "ElasticConfig",
    "Entrypoint",
    "EnvironmentConfig",
    "FrayError",
    "GpuConfig",
    "Goodput",
    "HostPreempted",
    "JobContext",
    "JobFailedError",
    "JobFunction",
    "JobId",
    "JobInfo",
    "JobNotFoundError",
    "JobRequest",
    "JobStatus",
    "LoggingMonitorView",
    "RemoteCallError",
    "ResourceConfig",
    "Session",
    "SyncContext",
    "TaskStatus",
    "ThreadContext",
    "TpuConfig",
    "TpuSpec",
    "UnknownBackendError",
    "Unschedulable",
    "WaitTimeoutError",
    "cluster_from_spec",
    "create_environment",
    "create_job_ctx",
    "current_cluster",
    "fray_default_job_ctx",
    "fray_job_ctx",
    "get_default_job_ctx",
    "get_tpu_spec",
    "heartbeat",
    "job",
    "parse_size",
    "parse_spec",
    "preemption_notice",
    "register_backend",
    "set_current_cluster",
    "tpu_types",
    "using_cluster",
    "worker_state",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

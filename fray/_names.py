"""Where each of marin's ``fray`` names lives in Fray: one table, used by every module of the ``fray`` package."""

from __future__ import annotations

#: ``fray.cluster`` (marin's ``fray.cluster`` / ``fray.v1.cluster``)
CLUSTER: dict[str, str] = {
    "Cluster": "fray_core.cluster",
    "CpuConfig": "fray_core.types",
    "DeviceKind": "fray._marin",
    "GpuType": "fray._marin",
    "TPU_TOPOLOGIES": "fray._marin",
    "TpuTopologyInfo": "fray._marin",
    "TpuType": "fray._marin",
    "get_tpu_topology": "fray._marin",
    "DeviceConfig": "fray_core.types",
    "Entrypoint": "fray_core.types",
    "EnvironmentConfig": "fray_core.types",
    "GpuConfig": "fray_core.types",
    "JobId": "fray_core.types",
    "JobInfo": "fray_core.types",
    "JobRequest": "fray_core.types",
    "JobStatus": "fray_core.types",
    "LocalCluster": "fray_local.cluster",
    "LocalClusterConfig": "fray_local.cluster",
    "LoggingMonitorView": "fray_core.cluster",
    "ResourceConfig": "fray_core.types",
    "TaskStatus": "fray_core.types",
    "TpuConfig": "fray_core.types",
    "create_cluster": "fray._marin",
    "create_environment": "fray_core.types",
    "current_cluster": "fray_core.cluster",
    "set_current_cluster": "fray_core.cluster",
}

#: ``fray.job`` (marin's ``fray.job`` / ``fray.v1.job``)
JOB: dict[str, str] = {
    "ActorHandle": "fray_core.context",
    "CONTEXT_TYPES": "fray_core.context",
    "JobContext": "fray_core.context",
    "RayContext": "fray._marin",
    "SimpleActor": "fray._marin",
    "SyncContext": "fray_core.context",
    "ThreadContext": "fray_core.context",
    "create_job_ctx": "fray_core.cluster",
    "fray_default_job_ctx": "fray_core.context",
    "fray_job_ctx": "fray_core.cluster",
    "get_default_job_ctx": "fray_core.cluster",
    "set_job_ctx": "fray._marin",
}

#: ``fray`` itself: what the migration guide imports from it, and the names of both tables above
TOP: dict[str, str] = {
    **CLUSTER,
    **JOB,
    "JobFailedError": "fray_core.errors",
    "JobNotFoundError": "fray_core.errors",
    "WaitTimeoutError": "fray_core.errors",
    "job": "fray_core.decorator",
    "using_cluster": "fray_core.cluster",
}

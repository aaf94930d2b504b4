"""``RayCluster``: jobs on a Ray cluster, TPU slices gang-scheduled by the shared fray_core runner.

Example::

    from fray_core import JobRequest, Entrypoint, ResourceConfig, using_cluster
    from fray_ray import RayCluster

    cluster = RayCluster(address="auto")                 # or current_cluster() with FRAY_CLUSTER_SPEC=ray
    job_id = cluster.launch(JobRequest(name="train", entrypoint=Entrypoint(callable=train),
                                       resources=ResourceConfig.with_tpu("v4-16", slice_count=2)))
    cluster.wait(job_id, timeout=3600, raise_on_failure=True).result   # one entry per host

Each job is supervised by a detached actor on a non-preemptible node (the head node by default), so
``launch`` returns at once and the job outlives the launching process; any process connected to the same
cluster can ``poll``/``wait``/``terminate``/``logs`` it by id. Records and logs live in the job store
(``jobs_dir``: give a ``gs://`` URL for a cluster of several machines).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import ray

from fray_core.cluster import Cluster, check_spec_keys
from fray_core.errors import FrayError, JobNotFoundError
from fray_core.records import JobStore, default_jobs_dir, new_job_id
from fray_core.runner import RetryPolicy
from fray_core.types import JobId, JobInfo, JobRequest, JobStatus, summarize_request
from fray_local.cluster import check_picklable
from fray_ray._host import gce_preempted
from fray_ray.supervisor import JobSupervisor, supervisor_name

__all__ = ["RayCluster", "DEFAULT_RAY_POLICY"]

DEFAULT_RAY_POLICY = RetryPolicy(backoff_initial=1.0, backoff_max=60.0, schedule_timeout=600.0, poll_interval=0.5, cancel_grace=30.0)
DEFAULT_NAMESPACE = "fray"
_KV_JOBS_DIR = b"fray:jobs_dir"
TERMINATE_TIMEOUT = 60.0
# ``launch`` writes the PENDING record, then creates the supervisor: another thread or process polling in
# between must not call the job's supervisor gone. Once the supervisor wrote the record, no grace.
SUPERVISOR_START_GRACE = 30.0

_Supervisor = ray.remote(JobSupervisor)


class RayCluster(Cluster):
    """The Ray backend.

    - ``address``: passed to ``ray.init`` when this process is not connected yet (``"auto"``: the local
      cluster started with ``ray start``).
    - ``namespace``: where the job supervisors live (default ``"fray"``); processes that share it see
      each other's jobs.
    - ``jobs_dir``: the job store. Default: the one the cluster already uses (kept in Ray's KV store by
      the first client), else ``$FRAY_JOBS_DIR`` / ``~/.cache/fray/jobs``.
    - ``retry_policy``: backoff and deadlines of the shared runner.
    - ``non_preemptible_resource``: a resource only non-preemptible nodes have; supervisors and
      ``preemptible=False`` work request a sliver of it (default: Ray's head-node marker).
    - ``preemption_probe``: run on a host whose work failed; True means the VM was preempted (default:
      GCE metadata, 0.5 s timeout, False off GCE). Must be picklable.
    - ``autoscaling``: when True, a request for more slices than the cluster has waits (up to the
      runner's schedule timeout) instead of failing at once.
    """

    def __init__(
        self,
        address: str | None = "auto",
        namespace: str | None = None,
        jobs_dir: str | None = None,
        retry_policy: RetryPolicy | None = None,
        non_preemptible_resource: str = "node:__internal_head__",
        preemption_probe: Callable[[], bool] | None = gce_preempted,
        autoscaling: bool = False,
    ) -> None:
        if not ray.is_initialized():
            ray.init(address=address, logging_level="WARNING", configure_logging=True)
        self.address = address
        self.namespace = namespace or DEFAULT_NAMESPACE
        self.policy = retry_policy or DEFAULT_RAY_POLICY
        self.non_preemptible_resource = non_preemptible_resource
        self.preemption_probe = preemption_probe
        self.autoscaling = autoscaling
        self.store = JobStore(jobs_dir or self._shared_jobs_dir())
        self.spec = "ray" if address in (None, "auto") else f"ray?address={address}"

    def __repr__(self) -> str:
        return f"RayCluster(address={self.address!r}, namespace={self.namespace!r}, jobs_dir={self.store.root!r})"

    @staticmethod
    def _shared_jobs_dir() -> str:
        """The jobs dir the cluster's first client chose, so every client finds the same records."""
        try:
            from ray.experimental import internal_kv

            stored = internal_kv._internal_kv_get(_KV_JOBS_DIR, namespace=DEFAULT_NAMESPACE)
            if stored:
                return stored.decode()
            mine = default_jobs_dir()
            internal_kv._internal_kv_put(_KV_JOBS_DIR, mine.encode(), overwrite=False, namespace=DEFAULT_NAMESPACE)
            return mine
        except Exception:  # KV unavailable (e.g. Ray client mode): every client uses its own default
            return default_jobs_dir()

    # ---------------------------------------------------------------------------------------- launch

    def launch(self, request: JobRequest) -> JobId:
        if not isinstance(request, JobRequest):
            raise TypeError(f"launch: expected a JobRequest, got {request!r}")
        check_picklable(request)
        job_id = new_job_id(request.name)
        info = JobInfo(
            job_id=job_id, name=request.name, status=JobStatus.PENDING, backend="ray", request_summary=summarize_request(request)
        )
        self.store.write(info, owner={"ray_actor": supervisor_name(job_id), "namespace": self.namespace})
        settings = {
            "jobs_dir": self.store.root,
            "sys_path": [os.getcwd()] + [p for p in sys.path if p],
            "cwd": os.getcwd(),
            "policy": self.policy,
            "namespace": self.namespace,
            "non_preemptible_resource": self.non_preemptible_resource,
            "preemption_probe": self.preemption_probe,
            "autoscaling": self.autoscaling,
        }
        _Supervisor.options(
            name=supervisor_name(job_id),
            namespace=self.namespace,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=64,
            max_restarts=0,
            resources={self.non_preemptible_resource: 0.001},
        ).remote(job_id, cloudpickle.dumps(request), settings)
        return job_id

    # ------------------------------------------------------------------------------------------ poll

    def _supervisor(self, job_id: str) -> Any | None:
        try:
            return ray.get_actor(supervisor_name(job_id), namespace=self.namespace)
        except ValueError:
            return None

    def poll(self, job_id: JobId | str) -> JobInfo:
        record = self.store.read(str(job_id))
        info = JobInfo.from_json(record)
        if (
            not info.status.is_terminal()
            and record.get("backend") == "ray"
            and (info.attempts or info.status is not JobStatus.PENDING or time.time() - info.submitted_at > SUPERVISOR_START_GRACE)
            and self._supervisor(str(job_id)) is None
        ):
            # Re-read: the supervisor writes the final record just before it goes away.
            info = JobInfo.from_json(self.store.read(str(job_id)))
            if not info.status.is_terminal():
                info.status = JobStatus.FAILED
                info.error = (
                    f"the job's supervisor actor {supervisor_name(str(job_id))!r} (namespace {self.namespace!r}) is gone "
                    "before the job ended: its node died or the Ray cluster restarted"
                )
        if info.status is JobStatus.SUCCEEDED:
            info.result = self.store.read_result(str(job_id))
        return info

    def list_jobs(self) -> list[JobInfo]:
        out = []
        for job_id in self.store.list_ids():
            try:
                info = self.poll(job_id)
            except (JobNotFoundError, ValueError, KeyError):
                continue
            if info.backend == "ray":
                out.append(info)
        out.sort(key=lambda i: i.submitted_at)
        return out

    # ------------------------------------------------------------------------------------- terminate

    def terminate(self, job_id: JobId | str) -> None:
        job_id = str(job_id)
        if self.poll(job_id).status.is_terminal():
            return
        actor = self._supervisor(job_id)
        if actor is not None:
            try:
                ray.get(actor.stop.remote(), timeout=TERMINATE_TIMEOUT)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass  # it ended meanwhile, or is stuck: the deadline below decides
        end = time.monotonic() + TERMINATE_TIMEOUT
        while time.monotonic() < end:
            if self.poll(job_id).status.is_terminal():
                return
            time.sleep(0.1)
        if actor is not None:
            ray.kill(actor, no_restart=True)  # its placement groups and tasks go with it (it owns them)
        raise FrayError(f"terminate: job {job_id} did not stop within {TERMINATE_TIMEOUT:.0f} s; its supervisor was killed")

    # ------------------------------------------------------------------------------------------ logs

    def logs(self, job_id: JobId | str, follow: bool = False) -> Iterator[str]:
        self.store.read(str(job_id))  # unknown ids fail here, before iteration
        return self.store.iter_log(str(job_id), follow, lambda: self.poll(job_id).status.is_terminal())

    def job_context(self) -> Any:
        from fray_ray.context import RayJobContext

        return RayJobContext(namespace=self.namespace, non_preemptible_resource=self.non_preemptible_resource)


def _from_spec(params: dict[str, str]) -> RayCluster:
    """``ray``, ``ray?address=10.0.0.1:6379&namespace=team&jobs_dir=gs://bucket/fray``."""
    check_spec_keys(params, ["address", "namespace", "jobs_dir"], "ray")
    return RayCluster(
        address=params.get("address") or "auto", namespace=params.get("namespace") or None, jobs_dir=params.get("jobs_dir") or None
    )

"""levanter's ``run_on_pod`` rewritten natively: a ``JobRequest`` launched without blocking.

What the native form gives over the compat layer: ``launch`` returns at once (the job outlives the
caller on Ray), ``JobInfo.attempts`` says what happened to every attempt, and the job is visible to
``fray list`` / ``fray status``. ``replicas=[1, 2]`` is levanter's variable multislice.

Runs on a simulated fleet of 2 x v4-16 unless FRAY_CLUSTER_SPEC names a cluster.
"""

from __future__ import annotations

import os

from fray_core import Entrypoint, JobRequest, ResourceConfig, TpuConfig, using_cluster

try:
    from _common import example_cluster
except ImportError:  # imported as examples.migration.levanter_native
    from examples.migration._common import example_cluster


def train() -> str:
    if os.environ["FRAY_ATTEMPT"] == "0" and os.environ["TPU_WORKER_ID"] == "0":
        raise RuntimeError("transient failure on host 0")  # retried within max_retries_failure
    return (
        f"host {os.environ['TPU_WORKER_ID']} of {os.environ['TPU_NAME']} "
        f"({os.environ.get('MEGASCALE_NUM_SLICES', '1')} slices)"
    )


def main() -> None:
    request = JobRequest(
        name="levanter-train",
        entrypoint=Entrypoint(callable=train),
        resources=ResourceConfig(device=TpuConfig(type="v4-16"), replicas=[1, 2]),
        max_retries_preemption=10_000,
        max_retries_failure=2,
    )
    with using_cluster(example_cluster()) as cluster:
        job_id = cluster.launch(request)  # returns at once
        info = cluster.wait(job_id, timeout=120, raise_on_failure=True)
    print("attempts: " + ", ".join(f"{a.index}:{a.outcome.value}" for a in info.attempts))
    for line in info.result:
        print(line)


if __name__ == "__main__":
    main()

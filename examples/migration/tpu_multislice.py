"""Pattern 5: TPU and multislice scheduling becomes ``TpuConfig`` + ``replicas``.

Before (Ray)::

    @ray.remote(resources={"TPU": 4, "TPU-v4-16-head": 1})
    def train(): ...
    # plus placement groups / actors per slice, MEGASCALE_* env built by hand for multislice

After (Fray): one request; every host of every slice runs ``train`` with its TPU_* and (for more than one
slice) MEGASCALE_* variables set. ``replicas=[1, 2]`` would accept either slice count.

Runs on a simulated fleet of 2 x v4-16 unless FRAY_CLUSTER_SPEC names a cluster.
"""

from __future__ import annotations

import os

from fray_core import Entrypoint, JobRequest, ResourceConfig, TpuConfig, using_cluster

try:
    from _common import example_cluster
except ImportError:  # imported as examples.migration.tpu_multislice
    from examples.migration._common import example_cluster


def train(steps: int) -> str:
    return (
        f"slice {os.environ['MEGASCALE_SLICE_ID']}/{os.environ['MEGASCALE_NUM_SLICES']} "
        f"host {os.environ['TPU_WORKER_ID']} on {os.environ['TPU_NAME']}: {steps} steps"
    )


def main() -> None:
    request = JobRequest(
        name="train-multislice",
        entrypoint=Entrypoint(callable=train, function_args={"steps": 10}),
        resources=ResourceConfig(cpu=1, ram="16g", device=TpuConfig(type="v4-16"), replicas=2),
        max_retries_preemption=10,
    )
    with using_cluster(example_cluster()) as cluster:
        job_id = cluster.launch(request)
        info = cluster.wait(job_id, timeout=120, raise_on_failure=True)
    for line in info.result:
        print(line)


if __name__ == "__main__":
    main()

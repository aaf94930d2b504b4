"""A 2-slice TPU job on a simulated fleet, with one injected preemption, on the local backend.

    python examples/multislice_demo.py

Every host is a real subprocess with the environment a TPU host would get (TPU_WORKER_ID, TPU_NAME,
MEGASCALE_*). Slice 1 is preempted 1 s into the first attempt; the runner cancels the other hosts,
releases both slices, and retries on the restored capacity with a freshly computed multislice env.
"""

from __future__ import annotations

import os
import time

from fray_core import Entrypoint, JobRequest, ResourceConfig, using_cluster
from fray_local import FaultPlan, LocalCluster, PreemptSlice, TpuFleet


def train(steps: int) -> str:
    """Stands in for a multislice training step loop."""
    slice_id, host = os.environ["MEGASCALE_SLICE_ID"], os.environ["TPU_WORKER_ID"]
    for step in range(steps):
        print(
            f"step {step} on slice {slice_id} host {host} (coordinator {os.environ['MEGASCALE_COORDINATOR_ADDRESS']})"
        )
        time.sleep(0.3)
    return f"slice {slice_id} host {host}: done {steps} steps"


def main() -> None:
    fleet = TpuFleet({"v4-16": 2}, fault_plan=FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=1.0)]))
    cluster = LocalCluster(fleet=fleet)
    with using_cluster(cluster):
        job_id = cluster.launch(
            JobRequest(
                name="multislice-demo",
                entrypoint=Entrypoint(callable=train, function_args={"steps": 6}),
                resources=ResourceConfig.with_tpu("v4-16", slice_count=2),
                max_retries_preemption=3,
            )
        )
        print(f"launched {job_id} on {fleet}")
        info = cluster.monitor(job_id, timeout=120)

    print(f"\njob {info.job_id}: {info.status.value}, preemptions={info.preemptions}, failures={info.failures}")
    print(f"{'attempt':<8} {'slices':<20} {'outcome':<11} cause")
    for a in info.attempts:
        cause = (a.cause or "").strip().splitlines()[0] if a.cause else ""
        print(f"{a.index:<8} {', '.join(a.slices):<20} {a.outcome.value if a.outcome else '-':<11} {cause}")
    print("\nresults (one per host, in slice/host order):")
    for r in info.result or []:
        print(f"  {r}")
    cluster.close()


if __name__ == "__main__":
    main()

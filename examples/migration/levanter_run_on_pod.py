"""levanter's ``run_on_pod`` through the compat layer: only the import changes.

Before (levanter)::

    from levanter.infra.ray_tpu import run_on_pod

    @ray.remote(max_calls=1)
    def train(): ...

    results = run_on_pod(train, "v4-16", num_slices=2, max_retries_preemption=10, max_retries_failure=2)

After: ``from fray_core.compat.levanter import run_on_pod``; the function may stay ``@ray.remote`` or be
plain. Here slice 1 is preempted 0.5 s into the first attempt: the whole gang is restarted.

Runs on a simulated fleet of 2 x v4-16 unless FRAY_CLUSTER_SPEC names a cluster.
"""

from __future__ import annotations

import os
import time

from fray_core import using_cluster
from fray_core.compat.levanter import run_on_pod
from fray_local import FaultPlan, PreemptSlice

try:
    from _common import example_cluster
except ImportError:  # imported as examples.migration.levanter_run_on_pod
    from examples.migration._common import example_cluster


def train() -> str:
    if os.environ["FRAY_ATTEMPT"] == "0":
        time.sleep(30)  # preempted long before this ends
    return (
        f"attempt {os.environ['FRAY_ATTEMPT']} slice {os.environ['MEGASCALE_SLICE_ID']} host "
        f"{os.environ['TPU_WORKER_ID']}"
    )


def main() -> None:
    plan = FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=0.5)])
    with using_cluster(example_cluster(fault_plan=plan)):
        results = run_on_pod(train, "v4-16", num_slices=2, max_retries_preemption=10, max_retries_failure=2)
    for line in results:
        print(line)


if __name__ == "__main__":
    main()

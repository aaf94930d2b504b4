"""A levanter training script that uses ``run_on_pod_resumable``, run unchanged: only the install line
differs (``pip install fray-jobs`` instead of marin's ``lib/fray``).

Everything below the marker is written as marin's experiments and levanter's launch scripts write it: a
``@ray.remote(max_calls=1)`` function that resumes from its own checkpoint, handed to
``run_on_pod_resumable`` imported from ``fray.cluster.ray.tpu`` (marin's path; ``fray.v1.cluster.ray.tpu`` and
marin's ``levanter.infra.ray_tpu``, which re-exports it, give the same function). The first attempt saves a
checkpoint and then times out, which levanter counts as a preemption; the second resumes from the checkpoint.

On a laptop this runs on the local backend's simulated v4-8; with ``FRAY_CLUSTER_SPEC=ray`` (or submitted
with ``ray job submit``, which sets ``RAY_ADDRESS``) it runs on that Ray cluster's TPU slices.
"""

# ---- levanter script, unchanged ------------------------------------------------------------------------
import os

import ray

from fray.cluster.ray.tpu import run_on_pod_resumable

CHECKPOINT = os.path.abspath("checkpoints/step")
TOTAL_STEPS = 100


@ray.remote(max_calls=1)
def train_on_pod() -> str:
    start = int(open(CHECKPOINT).read()) if os.path.exists(CHECKPOINT) else 0
    if start == 0:
        os.makedirs(os.path.dirname(CHECKPOINT), exist_ok=True)
        with open(CHECKPOINT, "w") as f:
            f.write("50")  # half the steps done, then the host stops answering
        raise TimeoutError("TPU host timed out after step 50")
    return f"host {os.environ['TPU_WORKER_ID']} resumed at step {start}, finished at step {TOTAL_STEPS}"


if __name__ == "__main__":
    results = run_on_pod_resumable(train_on_pod, "v4-8", max_retries_failure=0)
    for line in results:
        print(line)

"""Pattern 4: pinning a controller to the Ray head node becomes ``preemptible=False``.

Before (Ray)::

    @ray.remote(num_cpus=0.1, resources={"node:__internal_head__": 0.001})
    def controller(steps: list[str]) -> list[str]: ...

    # or: scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id, soft=False)

After (Fray): the requirement is what the pin was for: capacity that is not preempted. On Ray the job
lands on non-preemptible nodes; locally nothing is ever preempted.
"""

from __future__ import annotations

from fray_core import Entrypoint, JobRequest, ResourceConfig, current_cluster
from fray_core.compat.ray_resources import resources_from_ray_options


def controller(steps: list[str]) -> list[str]:
    return [f"ran {step}" for step in steps]


def main() -> None:
    resources = ResourceConfig(cpu=0.1, ram="512m", preemptible=False)
    converted = resources_from_ray_options(num_cpus=0.1, resources={"node:__internal_head__": 0.001})
    assert converted.preemptible is False and converted.cpu == 0.1
    cluster = current_cluster()
    job_id = cluster.launch(
        JobRequest(
            name="controller",
            entrypoint=Entrypoint(callable=controller, function_args={"steps": ["tokenize", "train"]}),
            resources=resources,
        )
    )
    info = cluster.wait(job_id, timeout=120, raise_on_failure=True)
    print(f"controller (preemptible={resources.preemptible}) -> {info.result[0]}")


if __name__ == "__main__":
    main()

"""Pattern 3: ``@ray.remote(runtime_env=...)`` becomes a job with an ``EnvironmentConfig``.

Before (Ray)::

    @ray.remote(runtime_env={"pip": ["attrs"], "env_vars": {"EVAL_MODE": "fast"}})
    def evaluate(model: str) -> str:
        import attrs
        ...

    ray.get(evaluate.remote("llama"))

After (Fray): the function imports what it needs; the caller launches it as a job whose environment
lists the packages and variables (on Ray they become the job's runtime_env; locally nothing is
installed and missing packages are warned about). ``environment_from_runtime_env`` converts an existing
runtime_env dict mechanically.
"""

from __future__ import annotations

import os

from fray_core import Entrypoint, JobRequest, ResourceConfig, create_environment, current_cluster
from fray_core.compat.ray_resources import environment_from_runtime_env


def evaluate(model: str) -> str:
    import attrs  # installed by the job's environment

    return f"{model}: mode={os.environ['EVAL_MODE']} attrs={attrs.__name__}"


def main() -> None:
    environment = create_environment(pip_packages=["attrs"], env_vars={"EVAL_MODE": "fast"})
    assert environment == environment_from_runtime_env({"pip": ["attrs"], "env_vars": {"EVAL_MODE": "fast"}})
    cluster = current_cluster()
    job_id = cluster.launch(
        JobRequest(
            name="evaluate",
            entrypoint=Entrypoint(callable=evaluate, function_args={"model": "llama"}),
            resources=ResourceConfig(cpu=1, ram="1g"),
            environment=environment,
        )
    )
    info = cluster.wait(job_id, timeout=120, raise_on_failure=True)
    print(f"evaluate -> {info.result[0]}")


if __name__ == "__main__":
    main()

"""A marin module written against marin's Fray v1, run unchanged: only the install line differs
(``pip install fray-jobs`` instead of marin's ``lib/fray``).

Everything below the marker is marin-style code: ``fray.v1.cluster`` types, ``current_cluster()``, lowercase
status strings, ``error_message``, per-replica ``tasks``, ``FRAY_REPLICA_COUNT`` and a ``SyncContext`` from
``fray.v1.job``. Runs on the local backend (replica output goes to Python logging as ``[replica-N] ...``).
"""

from __future__ import annotations

import logging
import os

# ---- marin code, unchanged ----------------------------------------------------------------------------
from fray.v1.cluster import Entrypoint, EnvironmentConfig, JobRequest, ResourceConfig, current_cluster
from fray.v1.job import SimpleActor, create_job_ctx

logger = logging.getLogger(__name__)


def tokenize_shard() -> str:
    replica, count = os.environ["FRAY_REPLICA_ID"], os.environ["FRAY_REPLICA_COUNT"]
    print(f"tokenizing shard {replica} of {count}")
    return f"shard {replica}/{count} JAX_PLATFORMS={os.environ['JAX_PLATFORMS']}"


def run_tokenize() -> list[str]:
    cluster = current_cluster()
    request = JobRequest(
        name="tokenize",
        entrypoint=Entrypoint.from_callable(tokenize_shard),
        resources=ResourceConfig.with_cpu(replicas=2),
        environment=EnvironmentConfig.create(env_vars={"TOKENIZERS_PARALLELISM": "false"}),
    )
    job_id = cluster.launch(request)
    info = cluster.monitor(job_id)
    if info.status != "succeeded":
        raise RuntimeError(f"tokenize failed: {info.error_message}")
    logger.info("tasks: %s", [t.status for t in info.tasks])
    return info.result


def count_with_actor() -> int:
    ctx = create_job_ctx("sync")
    counter = ctx.create_actor(SimpleActor, 0, name="counter", get_if_exists=True)
    ctx.get([counter.increment.remote(1) for _ in range(3)])
    return ctx.get(counter.get_value.remote())


# ---- end of marin code --------------------------------------------------------------------------------


def main() -> None:
    from fray_core import using_cluster
    from fray_local import LocalCluster, LocalClusterConfig

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with using_cluster(LocalCluster(LocalClusterConfig(log_to="logging"))):
        for line in run_tokenize():
            print(line)
    print(f"actor count: {count_with_actor()}")


if __name__ == "__main__":
    main()

"""Pattern 7: ``JobSubmissionClient.submit_job`` becomes ``cluster.launch``.

Before (Ray)::

    client = JobSubmissionClient("http://127.0.0.1:8265")
    job_id = client.submit_job(
        entrypoint="python -c 'import os; print(os.environ[\"RUN_ID\"])'",
        runtime_env={"env_vars": {"RUN_ID": "exp-42"}},
    )
    client.get_job_status(job_id); client.get_job_logs(job_id); client.stop_job(job_id)

After (Fray): a command is ``Entrypoint.from_binary``; ``poll`` / ``logs`` / ``terminate`` replace
``get_job_status`` / ``get_job_logs`` / ``stop_job``; the job record lets ``fray status ID`` and
``fray logs ID`` see it from another process.
"""

from __future__ import annotations

import sys

from fray_core import Entrypoint, JobRequest, create_environment, current_cluster


def main() -> None:
    cluster = current_cluster()
    job_id = cluster.launch(
        JobRequest(
            name="submitted",
            entrypoint=Entrypoint.from_binary(sys.executable, ["-c", "import os; print('run', os.environ['RUN_ID'])"]),
            environment=create_environment(env_vars={"RUN_ID": "exp-42"}),
        )
    )
    info = cluster.wait(job_id, timeout=120)
    print(f"status: {info.status.value}")
    for line in cluster.logs(job_id):
        print(f"log: {line}")


if __name__ == "__main__":
    main()

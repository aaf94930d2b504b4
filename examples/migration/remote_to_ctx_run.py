"""Pattern 2: a plain ``@ray.remote`` task becomes ``fray_job_ctx().run``, at the call site.

Before (Ray)::

    @ray.remote
    def score(doc_id: int) -> float: ...

    futures = [score.remote(i) for i in range(8)]
    ready, _ = ray.wait(futures, num_returns=2)
    scores = ray.get(futures)

After (Fray): the function is undecorated; the job context runs it (threads locally, Ray tasks on Ray).
The same code works at top level and inside a job's process.
"""

from __future__ import annotations

from fray_core import Entrypoint, JobRequest, current_cluster, fray_job_ctx


def score(doc_id: int) -> float:
    return doc_id * 0.5


def score_all(n: int) -> list[float]:
    ctx = fray_job_ctx()
    futures = [ctx.run(score, i) for i in range(n)]
    ready, _ = ctx.wait(futures, num_returns=2)  # ray.wait -> ctx.wait
    assert len(ready) == 2
    return ctx.get(futures)  # ray.get -> ctx.get


def main() -> None:
    print(f"scores at top level: {score_all(4)}")
    cluster = current_cluster()
    job_id = cluster.launch(
        JobRequest(name="score-all", entrypoint=Entrypoint(callable=score_all, function_args={"n": 3}))
    )
    info = cluster.wait(job_id, timeout=120, raise_on_failure=True)
    print(f"scores inside a job: {info.result[0]}")


if __name__ == "__main__":
    main()

"""Elastic multislice on Ray (the session's emulated cluster, conftest.py: head + 2 x v4-16): a job with
``replicas=[2, 1]`` grows to 2 slices when another job gives its slice back (its hosts get SIGTERM and
checkpoint within ``grace``; the attempt ends RESIZED, spending no budget), and shrinks to 1 slice after
a preemption, growing back when the slice returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from test_elastic import elastic_host  # noqa: E402
from test_policy import hold_until  # noqa: E402
from test_ray_chaos import leftovers  # noqa: E402

from fray_core import ElasticConfig, Entrypoint, JobInfo, JobRequest, JobStatus, ResourceConfig, TpuConfig  # noqa: E402
from fray_core.types import AttemptOutcome  # noqa: E402

TPU = "v4-16"
# Generous: a host ends as soon as it has checkpointed; only one that never does waits this out.
GRACE = 60.0

# The binary twin of test_elastic.elastic_host: on attempt 0, checkpoint on SIGTERM (trap set before the
# started mark); on a later attempt, note the env and exit 0. "$1" is the marks directory.
CHECKPOINTING_BINARY = r"""
tag="a${FRAY_ATTEMPT}-${TPU_NAME}-h${FRAY_HOST_ID}"
if [ "$FRAY_ATTEMPT" = 0 ]; then
  trap 'touch "$1/checkpointed-$tag"; exit 0' TERM
  touch "$1/started-$tag"
  i=0
  while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
  echo "held for 60 s and never stopped"; exit 1
fi
echo "FRAY_NUM_SLICES=$FRAY_NUM_SLICES FRAY_ELASTIC=$FRAY_ELASTIC" > "$1/env-$tag"
"""


def elastic_request(name: str, entrypoint: Entrypoint) -> JobRequest:
    return JobRequest(
        name=name,
        entrypoint=entrypoint,
        resources=ResourceConfig(device=TpuConfig(type=TPU), replicas=[2, 1]),
        elastic=ElasticConfig(grow_after=1.0, grace=GRACE),
        max_retries_preemption=1,
    )


def both_slices(fake: Any) -> None:
    fake.wait_settled()  # each test starts from two live slices that Ray counts right
    wait_for(lambda: len(fake.slices().get(TPU, [])) == 2, timeout=120, what="both slices")


def marks_of(marks: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in marks.glob(f"{prefix}*"))


def no_leftovers(cluster: Any, *job_ids: str) -> None:
    for job_id in job_ids:
        record = cluster.store.read(job_id)
        wait_for(
            lambda job_id=job_id, record=record: not leftovers(job_id, record),
            timeout=30,
            what=f"no placement group or actor of {job_id} left ({leftovers(job_id, record)})",
        )


@pytest.mark.parametrize("kind", ["callable", "binary"])
def test_an_elastic_job_grows_when_another_job_ends_and_its_hosts_checkpoint_on_sigterm(
    ray_tpu_cluster: Any, tmp_path: Path, kind: str
) -> None:
    fake = ray_tpu_cluster
    both_slices(fake)
    cluster = fake.cluster
    marks = tmp_path / "marks"
    marks.mkdir()
    go = tmp_path / "go"
    if kind == "callable":
        entry = Entrypoint(callable=elastic_host, args=(str(marks), [0]))
    else:
        entry = Entrypoint(binary="sh", args=["-c", CHECKPOINTING_BINARY, "sh", str(marks)])
    blocker = cluster.launch(
        JobRequest(
            name="blocker",
            entrypoint=Entrypoint(callable=hold_until, args=(str(go),)),
            resources=ResourceConfig.with_tpu(TPU),
            max_retries_preemption=0,
        )
    )
    try:
        wait_for(lambda: cluster.poll(blocker).status is JobStatus.RUNNING, timeout=120, what="the blocker running")
        grows = cluster.launch(elastic_request("grows", entry))
        wait_for(lambda: len(marks_of(marks, "started-a0-")) == 2, timeout=120, what="attempt 0's two hosts running")
        first = cluster.poll(grows).attempts[0]
        assert len(first.slices) == 1  # the other slice is the blocker's
    finally:
        go.touch()  # the blocker ends: its slice is free
    info: JobInfo = cluster.wait(grows, timeout=240)
    assert info.status is JobStatus.SUCCEEDED, (info.error, info.attempts)
    assert [(a.outcome, len(a.slices)) for a in info.attempts] == [
        (AttemptOutcome.RESIZED, 1),
        (AttemptOutcome.SUCCEEDED, 2),
    ]
    assert "growing from 1 slice(s)" in (info.attempts[0].cause or "")
    assert (info.preemptions, info.failures) == (0, 0)  # RESIZED spends no budget
    # attempt 0's hosts were stopped gracefully: both got SIGTERM and checkpointed
    assert marks_of(marks, "checkpointed-") == [f"checkpointed-a0-{first.slices[0]}-h{h}" for h in (0, 1)]
    # results from 4 hosts = 2 slices x 2 hosts, which knew they were an elastic job on 2 slices
    assert len(info.result) == 4
    if kind == "callable":
        assert {(r["FRAY_ATTEMPT"], r["FRAY_NUM_SLICES"], r["FRAY_ELASTIC"]) for r in info.result} == {("1", "2", "1")}
    else:
        assert info.result == [None] * 4
        envs = [(marks / name).read_text().strip() for name in marks_of(marks, "env-a1-")]
        assert envs == ["FRAY_NUM_SLICES=2 FRAY_ELASTIC=1"] * 4
    assert cluster.wait(blocker, timeout=120).status is JobStatus.SUCCEEDED
    no_leftovers(cluster, grows, blocker)


def test_an_elastic_job_shrinks_after_a_preemption_and_grows_back_when_the_slice_returns(
    ray_tpu_cluster: Any, tmp_path: Path
) -> None:
    fake = ray_tpu_cluster
    both_slices(fake)
    cluster = fake.cluster
    marks = tmp_path / "marks"
    marks.mkdir()
    job = cluster.launch(elastic_request("shrinks", Entrypoint(callable=elastic_host, args=(str(marks), [0, 1]))))
    restored = False
    try:
        wait_for(lambda: len(marks_of(marks, "started-a0-")) == 4, timeout=120, what="attempt 0's four hosts running")
        first = cluster.poll(job).attempts[0]
        assert len(first.slices) == 2
        fake.preempt(first.slices[1], restore_after=None)  # gone: the job goes on with the slice it has left
        wait_for(lambda: len(marks_of(marks, "started-a1-")) == 2, timeout=180, what="attempt 1's two hosts running")
        assert [(a.outcome, len(a.slices)) for a in cluster.poll(job).attempts] == [
            (AttemptOutcome.PREEMPTED, 2),
            (None, 1),
        ]
        fake.add_slice(TPU, tries=3)  # the capacity is back: the job grows to 2 slices again
        restored = True
        info: JobInfo = cluster.wait(job, timeout=240)
    finally:
        if not restored:
            fake.add_slice(TPU, tries=3)  # leave the session's cluster as it was
    assert info.status is JobStatus.SUCCEEDED, (info.error, info.attempts)
    assert [(a.outcome, len(a.slices)) for a in info.attempts] == [
        (AttemptOutcome.PREEMPTED, 2),
        (AttemptOutcome.RESIZED, 1),
        (AttemptOutcome.SUCCEEDED, 2),
    ]
    assert (info.preemptions, info.failures) == (1, 0)  # the preemption counts, the resize does not
    # a preemption is no graceful stop (the survivors are killed); the resize is
    assert marks_of(marks, "checkpointed-") == [f"checkpointed-a1-{info.attempts[1].slices[0]}-h{h}" for h in (0, 1)]
    assert len(info.result) == 4
    assert {(r["FRAY_ATTEMPT"], r["FRAY_NUM_SLICES"], r["FRAY_ELASTIC"]) for r in info.result} == {("2", "2", "1")}
    no_leftovers(cluster, job)

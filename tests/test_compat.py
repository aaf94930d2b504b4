"""The compat layers: levanter's run_on_pod family on the simulated fleet and on the emulated Ray cluster,
and Ray task options -> ResourceConfig (unit and property tests)."""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fray_core import CpuConfig, GpuConfig, JobFailedError, ResourceConfig, TpuConfig, using_cluster
from fray_core.compat import levanter as lev
from fray_core.compat.levanter import (
    PodJobError,
    run_on_pod,
    run_on_pod_multislice,
    run_on_pod_multislice_resumable,
    run_on_pod_resumable,
    unwrap_remote_function,
)
from fray_core.compat.ray_resources import environment_from_runtime_env, resources_from_ray_options
from fray_core.tpu import TPU_CATALOG
from fray_local import FaultPlan, LocalCluster, PreemptSlice, TpuFleet

from helpers import check_hosts, wait_for

TPU = "v4-16"  # 2 hosts per slice

# ---------------------------------------------------------------------------- functions the hosts run


def host_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("FRAY_", "TPU_", "MEGASCALE_", "COMPAT_"))}
    env["pid"] = str(os.getpid())
    return env


def fail_first_attempt() -> dict[str, str]:
    if os.environ["FRAY_ATTEMPT"] == "0" and os.environ["FRAY_SLICE_ID"] == "0" and os.environ["FRAY_HOST_ID"] == "0":
        raise RuntimeError("slice 0 host 0 failed in attempt 0")
    return host_env()


class CompatTestError(ValueError):
    """A user-defined exception type, to check that callers can still catch it by class."""


def always_fails() -> None:
    raise CompatTestError("this function always fails")


def wait_for_release(marker_dir: str) -> dict[str, str]:
    """Writes its slice name to a marker, then runs until `release-a<attempt>` appears (or 120 s)."""
    attempt = os.environ["FRAY_ATTEMPT"]
    name = f"a{attempt}-s{os.environ['FRAY_SLICE_ID']}-h{os.environ['FRAY_HOST_ID']}"
    Path(marker_dir, name + ".tmp").write_text(os.environ["TPU_NAME"])
    os.replace(Path(marker_dir, name + ".tmp"), Path(marker_dir, name))
    end = time.monotonic() + 120
    while not Path(marker_dir, f"release-a{attempt}").exists() and time.monotonic() < end:
        time.sleep(0.05)
    return host_env()


def block_first_attempt(marker_dir: str) -> dict[str, str]:
    """Attempt 0 runs until preempted; later attempts return at once."""
    if os.environ["FRAY_ATTEMPT"] == "0":
        return wait_for_release(marker_dir)
    return host_env()


def times_out_until(marker_dir: str, n_calls: int) -> dict[str, str]:
    """levanter's ``PreemptionCountingActor``, with a file per call instead of an actor: raises
    ``TimeoutError`` (levanter: a preemption) on host 0 until the ``n_calls``-th attempt."""
    if os.environ["FRAY_HOST_ID"] == "0" and os.environ["FRAY_SLICE_ID"] == "0":
        Path(marker_dir, f"call-{os.environ['FRAY_ATTEMPT']}").touch()
        if len(list(Path(marker_dir).glob("call-*"))) < n_calls:
            raise TimeoutError("Simulated preemption via TimeoutError")
    return host_env()


def says_timed_out() -> None:
    raise OSError("the collective timed out after 600 s")


# ------------------------------------------------------------------------------------------- helpers


class InThread:
    """Run a blocking call (run_on_pod) in a thread so the test can act on the job meanwhile.

    The thread runs in a copy of this context: ``using_cluster`` is a ContextVar, which new threads do
    not inherit by themselves."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._run, fn), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def join(self, timeout: float = 180.0) -> InThread:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"run_on_pod still running after {timeout}s"
        return self


def markers(marker_dir: Path, attempt: int) -> list[Path]:
    return sorted(marker_dir.glob(f"a{attempt}-s*-h*"))


# ------------------------------------------------------------------ levanter scenarios, simulated fleet


def test_signatures_match_levanter() -> None:
    sig = inspect.signature(run_on_pod)
    assert list(sig.parameters) == [
        "remote_fn",
        "tpu_type",
        "num_slices",
        "max_retries_preemption",
        "max_retries_failure",
        "runtime_env",  # marin's later keyword
    ]
    assert sig.parameters["num_slices"].kind is inspect.Parameter.KEYWORD_ONLY
    assert (sig.parameters["num_slices"].default, sig.parameters["max_retries_preemption"].default) == (1, 10000)
    assert sig.parameters["max_retries_failure"].default == 10
    res = inspect.signature(run_on_pod_resumable).parameters
    assert (res["max_retries_preemption"].default, res["max_retries_failure"].default) == (1_000_000, 10)
    assert list(inspect.signature(run_on_pod_multislice).parameters) == ["remote_fn", "tpu_type", "num_slices"]
    mres = inspect.signature(run_on_pod_multislice_resumable).parameters
    assert (mres["max_retries_preemption"].default, mres["max_retries_failure"].default) == (1_000_000, 10)


def test_single_slice_runs(local_cluster: LocalCluster) -> None:
    result = run_on_pod(host_env, TPU)
    check_hosts(result, 1)
    assert run_on_pod_resumable(host_env, TPU)[0]["TPU_WORKER_ID"] == "0"  # the slice was released
    assert [j.status.value for j in local_cluster.list_jobs()] == ["SUCCEEDED", "SUCCEEDED"]


def test_multislice_sets_megascale_on_every_host(local_cluster: LocalCluster) -> None:
    check_hosts(run_on_pod(host_env, TPU, num_slices=2), 2)
    check_hosts(run_on_pod_multislice(host_env, TPU, 2), 2)


def test_fail_once_then_succeed(local_cluster: LocalCluster) -> None:
    result = run_on_pod(fail_first_attempt, TPU, num_slices=2, max_retries_failure=1)
    check_hosts(result, 2, attempt=1)
    info = local_cluster.list_jobs()[-1]
    assert [a.outcome.value for a in info.attempts] == ["FAILED", "SUCCEEDED"]
    assert "RuntimeError: slice 0 host 0 failed in attempt 0" in info.attempts[0].cause


def test_multislice_has_no_retries(local_cluster: LocalCluster) -> None:
    with pytest.raises(RuntimeError, match="slice 0 host 0 failed in attempt 0") as err:
        run_on_pod_multislice(fail_first_attempt, TPU, 2)
    assert err.value.info.failures == 1 and len(err.value.info.attempts) == 1


def test_always_fails_raises_with_the_error_kept(local_cluster: LocalCluster) -> None:
    with pytest.raises(CompatTestError) as err:  # the user's class, as levanter re-raised the remote error
        run_on_pod_resumable(always_fails, TPU, max_retries_failure=2)
    e = err.value
    assert isinstance(e, PodJobError) and isinstance(e, RuntimeError) and isinstance(e, JobFailedError)
    assert e.info.failures == 3 and e.info.preemptions == 0
    assert "failed 3 time(s), max_retries_failure=2" in str(e)
    assert "CompatTestError: this function always fails" in e.cause and "Traceback" in e.cause
    assert "always_fails" in str(e)  # the remote traceback is in the message


def test_preemption_is_retried(local_cluster: LocalCluster, tpu_fleet: TpuFleet, tmp_path: Path) -> None:
    tpu_fleet.model.fault_plan = FaultPlan([PreemptSlice(attempt=0, slice_index=1, after=0.5)])
    fn = functools.partial(block_first_attempt, str(tmp_path))
    result = run_on_pod_multislice_resumable(fn, TPU, 2, max_retries_failure=0)
    check_hosts(result, 2, attempt=1)
    info = local_cluster.list_jobs()[-1]
    assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "SUCCEEDED"] and info.failures == 0


def test_preemption_budget_exhausted(local_cluster: LocalCluster, tpu_fleet: TpuFleet, tmp_path: Path) -> None:
    tpu_fleet.model.fault_plan = FaultPlan([PreemptSlice(attempt=a, slice_index=0, after=0.5) for a in range(3)])
    fn = functools.partial(wait_for_release, str(tmp_path))
    with pytest.raises(
        PodJobError, match=r"preempted too many times: preempted 2 time\(s\), max_retries_preemption=1"
    ) as err:
        run_on_pod(fn, TPU, max_retries_preemption=1)
    assert [a.outcome.value for a in err.value.info.attempts] == ["PREEMPTED", "PREEMPTED"]
    assert not isinstance(err.value, ValueError)


def test_variable_multislice(local_cluster: LocalCluster, tmp_path: Path) -> None:
    check_hosts(run_on_pod(host_env, TPU, num_slices=[1, 2]), 2)  # both free: the largest count wins
    blocker = InThread(lambda: run_on_pod(functools.partial(wait_for_release, str(tmp_path)), TPU))
    wait_for(lambda: len(markers(tmp_path, 0)) == 2, what="the blocker to hold a slice")
    check_hosts(run_on_pod_multislice_resumable(host_env, TPU, [1, 2]), 1)  # one slice left: runs on it
    (tmp_path / "release-a0").touch()
    assert blocker.join().error is None and len(blocker.value) == 2


def test_bad_arguments_fail_before_anything_runs(local_cluster: LocalCluster) -> None:
    for bad in (0, [], [1, 0], "2", 1.5, True):
        with pytest.raises(ValueError, match="num_slices must be a positive integer or non-empty list"):
            run_on_pod(host_env, TPU, num_slices=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="TpuConfig.type: unknown TPU type 'v4-15'"):
        run_on_pod(host_env, "v4-15")
    with pytest.raises(TypeError, match="expected a callable"):
        run_on_pod(42, TPU)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_retries_failure: expected an int >= 0"):
        run_on_pod(host_env, TPU, max_retries_failure=-1)
    assert local_cluster.list_jobs() == []
    # levanter's older defaults were floats
    assert len(run_on_pod(host_env, TPU, max_retries_preemption=1e6, max_retries_failure=10.0)) == 2  # type: ignore[arg-type]


def test_a_request_that_never_fits_raises(local_cluster: LocalCluster) -> None:
    with pytest.raises(PodJobError, match="can never fit") as err:
        run_on_pod(host_env, TPU, num_slices=3)  # the fleet has 2 x v4-16
    assert not isinstance(err.value, ValueError) and err.value.info.status.value == "FAILED"


def test_an_interrupted_wait_terminates_the_job(
    local_cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted_wait(job_id: str, *args: Any, **kwargs: Any) -> None:
        wait_for(lambda: len(markers(tmp_path, 0)) == 2, what="the job's hosts to start")
        raise KeyboardInterrupt

    monkeypatch.setattr(local_cluster, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        run_on_pod(functools.partial(wait_for_release, str(tmp_path)), TPU)
    (job,) = local_cluster.list_jobs()
    assert job.status.value == "STOPPED"  # terminate() returned after every host was stopped


class _FakeRemoteFunction:
    """Ray's RemoteFunction, as far as the compat layer looks at it."""

    def __init__(self, fn: Callable[..., Any], **options: Any) -> None:
        self._function = fn
        self._default_options = options

    def remote(self, *args: Any) -> None:
        raise AssertionError("the compat layer must not call .remote()")


def test_remote_function_duck_typing(local_cluster: LocalCluster) -> None:
    fake = _FakeRemoteFunction(
        host_env, max_calls=1, num_cpus=8, runtime_env={"env_vars": {"COMPAT_FLAG": "on"}, "_ray_commit": "x"}
    )
    assert unwrap_remote_function(fake)[0] is host_env
    result = run_on_pod(fake, TPU)  # type: ignore[arg-type]
    assert [r["COMPAT_FLAG"] for r in result] == ["on", "on"]


def test_importing_the_compat_layer_never_imports_ray() -> None:
    code = "import fray_core.compat.levanter, fray_core.compat.ray_resources, sys; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_ray_remote_function_is_accepted(local_cluster: LocalCluster) -> None:
    ray = pytest.importorskip("ray")
    remote = ray.remote(max_calls=1, runtime_env={"env_vars": {"COMPAT_FLAG": "ray"}})(host_env)  # no ray.init needed
    fn, options = unwrap_remote_function(remote)
    assert fn is host_env and options["max_calls"] == 1
    result = run_on_pod(remote, TPU, num_slices=2)
    check_hosts(result, 2)
    assert {r["COMPAT_FLAG"] for r in result} == {"ray"}
    with pytest.raises(ValueError, match="Don't use bind"):
        run_on_pod(remote.bind(), TPU)
    with pytest.raises(TypeError, match=r"f.options\(...\)"):
        run_on_pod(remote.options(num_cpus=1), TPU)
    assert not ray.is_initialized()


def test_runtime_env_keyword_replaces_the_functions_own(local_cluster: LocalCluster) -> None:
    # marin's later run_on_pod(..., runtime_env=...): Ray lost the function's own runtime_env on the way
    fake = _FakeRemoteFunction(host_env, max_calls=1, runtime_env={"env_vars": {"COMPAT_FLAG": "own"}})
    result = run_on_pod(fake, TPU, runtime_env={"env_vars": {"COMPAT_FLAG": "explicit"}})  # type: ignore[arg-type]
    assert [r["COMPAT_FLAG"] for r in result] == ["explicit", "explicit"]


# marin's lib/levanter levanter/infra/ray_tpu.py re-exported these from fray.cluster.ray.tpu (the rest of that
# module, its docker helpers, needs levanter's own dependencies): with Fray installed as ``fray`` it delegates here
MARIN_LEVANTER_RAY_TPU = """
from fray.cluster.ray.tpu import (
    HEALTH_CHECK_TIMEOUT, START_ACTOR_TIMEOUT, TPU_CONFIGS, MultisliceInfo, ResourcePoolManager, SliceActor,
    SliceInfo, SlicePoolManager, TPUConfig, TPUHostActor, TPUHostInfo, TpuCancelled, TpuFailed, TpuPreempted,
    TpuRunError, TpuSuccess, get_current_tpu_is_preempted, get_tpu_config, run_on_pod, run_on_pod_multislice,
    run_on_pod_multislice_resumable, run_on_pod_ray, run_on_pod_resumable,
)
"""


def test_a_levanter_script_runs_through_marins_levanter_module(tmp_path: Path) -> None:
    """The levanter script of examples/migration, with levanter's own import line, through a levanter whose
    ``levanter.infra.ray_tpu`` delegates to ``fray.cluster.ray.tpu`` (marin's): it runs unchanged."""
    pkg = tmp_path / "site" / "levanter" / "infra"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "ray_tpu.py").write_text(MARIN_LEVANTER_RAY_TPU)
    example = Path(__file__).resolve().parent.parent / "examples" / "migration" / "levanter_resumable_script.py"
    source = example.read_text()
    marin_import = "from fray.cluster.ray.tpu import run_on_pod_resumable"
    assert marin_import in source
    script = tmp_path / "train.py"
    script.write_text(source.replace(marin_import, "from levanter.infra.ray_tpu import run_on_pod_resumable"))
    env = {k: v for k, v in os.environ.items() if k not in ("FRAY_CLUSTER_SPEC", "RAY_ADDRESS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), env.get("PYTHONPATH", "")])
    env["FRAY_JOBS_DIR"] = str(tmp_path / "jobs")
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["host 0 resumed at step 50, finished at step 100"]


def test_a_script_with_ray_address_goes_to_that_ray_cluster(tmp_path: Path) -> None:
    # levanter's ray.get connected to $RAY_ADDRESS by itself: a script submitted with `ray job submit` must
    # reach that cluster (here: nothing listens, so it fails naming it), not run on simulated local slices
    code = "from fray_core.compat.levanter import run_on_pod_resumable; print(run_on_pod_resumable(int, 'v4-8'))"
    env = {k: v for k, v in os.environ.items() if k != "FRAY_CLUSTER_SPEC"}
    env.update(RAY_ADDRESS="127.0.0.1:1", FRAY_JOBS_DIR=str(tmp_path / "jobs"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "RayConnectionError: cannot reach the Ray cluster at 127.0.0.1:1" in out.stderr
    env["FRAY_CLUSTER_SPEC"] = "local"  # a cluster chosen explicitly wins
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_marins_tpu_module_names() -> None:
    from fray.cluster.ray import tpu
    from fray.cluster.ray.resources import accelerator_descriptor, as_remote_kwargs
    from fray.v1.cluster.ray import tpu as tpu_v1

    assert tpu_v1.run_on_pod_resumable is run_on_pod_resumable and tpu.run_on_pod is run_on_pod
    # marin's table, for the types whose VMs it counted as hosts
    for row in [("v4-32", 16, 4, 4, 4), ("v5p-12288", 6144, 1536, 1536, 4), ("v6e-16", 16, 4, 4, 4)]:
        assert tpu.get_tpu_config(row[0]) == tpu.TPUConfig(*row)
    assert tpu.get_tpu_config("v5litepod-16").vm_count == 4 and "v5litepod-256" in {c.name for c in tpu.TPU_CONFIGS}
    with pytest.raises(ValueError, match="unknown TPU type"):
        tpu.get_tpu_config("v4-7")
    for replaced in (tpu.SliceActor, tpu.TPUHostActor, tpu.SlicePoolManager, tpu.ResourcePoolManager):
        with pytest.raises(NotImplementedError, match="Fray replaces"):
            replaced()
        with pytest.raises(NotImplementedError, match=replaced.__name__):
            replaced.remote()
    assert tpu.TpuPreempted(TimeoutError("x")).error.args == ("x",) and tpu.MultisliceInfo("h", 0, 2).port == 8081
    assert as_remote_kwargs(ResourceConfig.with_tpu("v4-8")) == {"num_cpus": 8}
    assert as_remote_kwargs(ResourceConfig.with_gpu(count=2)) == {"num_gpus": 2}
    assert accelerator_descriptor(ResourceConfig()) is None


def test_user_exception_class_lookup() -> None:
    cause = (
        "failed on slice 0 (v4-16-0) host 0: KeyError: 'x'\nTraceback (most recent call last):\n  File "
        "\"x\"\nKeyError: 'x'\n"
    )
    assert lev._user_exception_class(cause) is KeyError
    assert lev._user_exception_class("failed on replica 0: exit code 4\nsome output") is None
    assert lev._user_exception_class(f"{__name__}.CompatTestError: boom") is CompatTestError
    assert lev._user_exception_class("no_such_module.Err: boom") is None


def test_timeout_error_is_a_preemption_as_in_levanter(local_cluster: LocalCluster, tmp_path: Path) -> None:
    # levanter's test_single_slice_handles_preemption: 1 timeout, no failure budget at all -> still succeeds
    result = run_on_pod(
        functools.partial(times_out_until, str(tmp_path), 2), TPU, max_retries_failure=0, max_retries_preemption=2
    )
    check_hosts(result, 1, attempt=1)
    info = local_cluster.list_jobs()[-1]
    assert (info.preemptions, info.failures) == (1, 0)
    assert [a.outcome.value for a in info.attempts] == ["PREEMPTED", "SUCCEEDED"]
    assert "TimeoutError: Simulated preemption via TimeoutError" in info.attempts[0].cause


def test_timeouts_exhaust_the_preemption_budget(local_cluster: LocalCluster, tmp_path: Path) -> None:
    # 3 timeouts before the 4th call, 2 preemption retries: levanter raised RuntimeError("... preempted too many times")
    with pytest.raises(RuntimeError, match="preempted too many times") as err:
        run_on_pod(
            functools.partial(times_out_until, str(tmp_path), 4), TPU, max_retries_failure=1, max_retries_preemption=2
        )
    assert err.value.info.preemptions == 3 and err.value.info.failures == 0


def test_timed_out_in_the_message_is_a_preemption(local_cluster: LocalCluster) -> None:
    with pytest.raises(PodJobError, match="preempted too many times") as err:
        run_on_pod(says_timed_out, TPU, max_retries_failure=5, max_retries_preemption=0)
    assert err.value.info.failures == 0 and "OSError: the collective timed out" in err.value.cause


def test_fray_native_jobs_keep_timeout_as_a_failure(local_cluster: LocalCluster) -> None:
    # only the compat layer applies levanter's rule; Fray's own API keeps its typed outcomes
    from fray_core import Entrypoint, JobRequest, ResourceConfig

    job_id = local_cluster.launch(
        JobRequest(
            name="timeout", entrypoint=Entrypoint(callable=says_timed_out), resources=ResourceConfig.with_tpu(TPU)
        )
    )
    info = local_cluster.wait(job_id, timeout=120)
    assert info.status == "failed" and (info.failures, info.preemptions) == (1, 0)


# ------------------------------------------------------------------ levanter scenarios, emulated Ray


@pytest.fixture
def on_ray(ray_tpu_cluster: Any) -> Iterator[Any]:
    with using_cluster(ray_tpu_cluster.cluster):
        yield ray_tpu_cluster


@pytest.mark.ray
def test_ray_remote_variable_multislice_on_ray(on_ray: Any) -> None:
    ray = pytest.importorskip("ray")
    remote = ray.remote(max_calls=1, runtime_env={"env_vars": {"COMPAT_FLAG": "ray"}})(host_env)
    result = run_on_pod(remote, TPU, num_slices=[1, 2])
    check_hosts(result, 2)
    assert {r["COMPAT_FLAG"] for r in result} == {"ray"}


@pytest.mark.ray
def test_run_on_pod_ray_is_an_object_ref(on_ray: Any) -> None:
    # marin's ray.get(run_on_pod_ray.remote(fn, tpu_type, num_slices)): run_on_pod in a Ray task, on the
    # Ray cluster that task runs on
    import ray

    from fray.cluster.ray.tpu import run_on_pod_ray

    def where() -> str:  # nested: Ray ships it by value (this test module is not importable on the workers)
        import os

        return f"{os.environ['MEGASCALE_SLICE_ID']}/{os.environ['TPU_WORKER_ID']}"

    ref = run_on_pod_ray.remote(ray.remote(max_calls=1)(where), TPU, 2)
    assert isinstance(ref, ray.ObjectRef)
    assert ray.get(ref, timeout=120) == ["0/0", "0/1", "1/0", "1/1"]


@pytest.mark.ray
def test_fail_once_then_succeed_on_ray(on_ray: Any) -> None:
    check_hosts(run_on_pod(fail_first_attempt, TPU, max_retries_failure=1), 1, attempt=1)


@pytest.mark.ray
def test_always_fails_on_ray(on_ray: Any) -> None:
    # levanter's test_single_slice_catches_failure: a RayTaskError, also the user's class, with it as the cause
    from ray.exceptions import RayTaskError

    with pytest.raises(RayTaskError) as excinfo:
        run_on_pod(always_fails, TPU, num_slices=1, max_retries_failure=0, max_retries_preemption=0)
    e = excinfo.value
    assert "CompatTestError" in str(e) and isinstance(e, CompatTestError)
    assert isinstance(e.cause, CompatTestError) and str(e.cause) == "this function always fails"
    assert e.info.failures == 1 and e.info.status == "failed"


@pytest.mark.ray
def test_single_slice_and_multislice_on_ray(on_ray: Any) -> None:
    # levanter's test_single_slice_simple_run / test_multislice_run_twice: one result per host, twice in a row
    for _ in range(2):
        check_hosts(run_on_pod(host_env, TPU, num_slices=1), 1)
        check_hosts(run_on_pod(host_env, TPU, num_slices=2), 2)


@pytest.mark.ray
def test_multislice_fail_once_on_ray(on_ray: Any) -> None:
    check_hosts(run_on_pod(fail_first_attempt, TPU, num_slices=2, max_retries_failure=1), 2, attempt=1)


@pytest.mark.ray
def test_timeout_is_a_preemption_on_ray(on_ray: Any) -> None:
    # levanter's test_single_slice_handles_preemption, as levanter writes it: a Ray actor counts the calls and
    # raises TimeoutError (a preemption to levanter) until the n-th; the hosts call it with ray.get
    import ray

    @ray.remote
    class PreemptionCountingActor:
        """Actor to count calls to a preemptible function."""

        def __init__(self, fn_id: str, preempt_until_n_calls: int):
            self.fn_id = fn_id
            self.preempt_until_n_calls = preempt_until_n_calls
            self.call_count = 0

        def run(self):
            self.call_count += 1
            if self.call_count < self.preempt_until_n_calls:
                raise TimeoutError("Simulated preemption via TimeoutError")
            return self.call_count

    actor = PreemptionCountingActor.remote("preemptible_fn", preempt_until_n_calls=4)

    # the emulated slices have 2 hosts (levanter's test used 1-host v4-8): host 0 calls the actor
    @ray.remote(max_calls=1)
    def preempted_until_n():
        return ray.get(actor.run.remote()) if os.environ["TPU_WORKER_ID"] == "0" else 0

    with pytest.raises(RuntimeError) as excinfo:
        run_on_pod(preempted_until_n, "v4-16", num_slices=1, max_retries_failure=1, max_retries_preemption=2)
    assert "preempted too many times" in str(excinfo.value), excinfo.value

    actor = PreemptionCountingActor.remote("preemptible_fn_always", preempt_until_n_calls=2)

    @ray.remote(max_calls=1)
    def preempted_always():
        return ray.get(actor.run.remote()) if os.environ["TPU_WORKER_ID"] == "0" else 0

    results = run_on_pod(preempted_always, "v4-16", num_slices=1, max_retries_failure=0, max_retries_preemption=2)
    assert results == [2, 0]  # the second attempt's call


@pytest.mark.ray
def test_preemption_budget_exhausted_on_ray(on_ray: Any, tmp_path: Path) -> None:
    call = InThread(
        lambda: run_on_pod(functools.partial(wait_for_release, str(tmp_path)), TPU, max_retries_preemption=0)
    )
    wait_for(lambda: len(markers(tmp_path, 0)) == 2, timeout=120, what="both hosts of attempt 0 to start")
    on_ray.preempt(markers(tmp_path, 0)[0].read_text(), restore_after=0.0)
    err = call.join().error
    assert isinstance(err, PodJobError), err
    assert "preempted 1 time(s), max_retries_preemption=0" in str(err)


_UNLABELLED_SCRIPT = """
import os, sys
from ray.exceptions import RayTaskError
from fray_core import using_cluster
from fray_core.compat.levanter import run_on_pod
from fray_ray.testing import fake_tpu_cluster

def where():
    return f"{os.environ['TPU_NAME']} {os.environ.get('MEGASCALE_SLICE_ID', '-')}"

class DeliberatelyRaisedException(Exception):
    pass

def failing_fn():
    raise DeliberatelyRaisedException("This function is designed to fail.")

sys.modules["__main__"].DeliberatelyRaisedException = DeliberatelyRaisedException
with fake_tpu_cluster({"v4-8": 2}, labels=False) as fake, using_cluster(fake.cluster):
    print("single", run_on_pod(where, "v4-8", num_slices=1))
    print("multi", sorted(run_on_pod(where, "v4-8", num_slices=2)))
    try:
        run_on_pod(failing_fn, "v4-8", num_slices=1, max_retries_failure=0, max_retries_preemption=0)
    except RayTaskError as e:
        print("raised", type(e.cause).__name__, "DeliberatelyRaisedException" in str(e))
"""


@pytest.mark.ray
def test_levanter_fixture_without_tpu_labels(tmp_path: Path) -> None:
    """levanter's (and marin's) own Ray fixtures are TPU VMs with TPU resources (``TPU-v4-8-head``) and no
    ``ray.io/tpu-*`` labels: their tests run there too. A cluster of its own, so in a subprocess."""
    from fray_ray.testing import fake_tpu_cluster

    if "labels" not in inspect.signature(getattr(fake_tpu_cluster, "__wrapped__", fake_tpu_cluster)).parameters:
        pytest.skip("this fray_ray cannot emulate a cluster without TPU labels (fake_tpu_cluster(labels=False))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "FRAY_JOBS_DIR": str(tmp_path / "jobs")}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-c", _UNLABELLED_SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("single ['") and line.endswith(" -']") for line in lines), out.stdout
    multi = next(line for line in lines if line.startswith("multi "))
    assert " 0'" in multi and " 1'" in multi, multi
    assert "raised DeliberatelyRaisedException True" in lines, out.stdout


# ------------------------------------------------------------------------- Ray options -> ResourceConfig


def test_tpu_head_resource_gives_the_slice_type() -> None:
    rc = resources_from_ray_options(resources={"TPU": 4, "TPU-v4-8-head": 1})
    assert rc.device == TpuConfig("v4-8") and rc.replicas == 1 and rc.preemptible
    assert resources_from_ray_options(resources={"TPU-v5p-64-head": 1}).device == TpuConfig("v5p-64")
    assert resources_from_ray_options(resources={"TPU": 4}, accelerator_type="TPU-V4").device == TpuConfig("v4-8")
    assert resources_from_ray_options(resources={"TPU": 8, "accelerator_type:TPU-V6E": 1}).device == TpuConfig("v6e-8")
    assert resources_from_ray_options(resources={"TPU": 4}, accelerator_type="TPU-V5E").device == TpuConfig(
        "v5litepod-4"
    )


def test_head_node_and_plain_options() -> None:
    rc = resources_from_ray_options(num_cpus=0.5, memory=2 * 1024**3, resources={"node:__internal_head__": 0.001})
    assert (rc.cpu, rc.ram_bytes, rc.preemptible, rc.device) == (0.5, 2 * 1024**3, False, CpuConfig())
    assert resources_from_ray_options(resources={"head_node": 1}).preemptible is False
    assert (
        resources_from_ray_options(resources={"controller": 1}, head_node_resources={"controller"}).preemptible is False
    )
    assert resources_from_ray_options(memory=20e9).ram_bytes == 20 * 10**9
    assert resources_from_ray_options(num_gpus=8, accelerator_type="H100").device == GpuConfig("H100", 8)
    assert resources_from_ray_options(num_gpus=1).device == GpuConfig("auto", 1)
    assert resources_from_ray_options(num_gpus=0, max_calls=1) == resources_from_ray_options()
    assert resources_from_ray_options(scheduling_strategy="DEFAULT").cpu == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"resources": {"my_custom": 2}},
            r"resources\['my_custom'\]=2: Fray has no custom resources; allowed keys: 'TPU'",
        ),
        ({"resources": {"TPU": 4}}, r"resources\['TPU'\]=4 alone does not say which TPU"),
        (
            {"resources": {"TPU": 3}, "accelerator_type": "TPU-V4"},
            r"no single-host v4 slice has 3 chips.*v4-8 \(4 chips\)",
        ),
        ({"resources": {"TPU": 2, "TPU-v4-8-head": 1}}, r"resources\['TPU'\]=2: a v4-8 host has 4 chips; allowed: 4"),
        ({"resources": {"TPU-v4-15-head": 1}}, r"TPU-v4-15-head.*unknown TPU type 'v4-15'"),
        ({"resources": {"TPU-v4-8-head": 2}}, r"resources\['TPU-v4-8-head'\]=2.0: a slice has one head"),
        ({"num_gpus": 0.5}, r"num_gpus=0.5: Fray allocates whole GPUs"),
        ({"num_gpus": 1, "resources": {"TPU-v4-8-head": 1}}, r"one device kind"),
        ({"accelerator_type": "A100"}, r"accelerator_type='A100' without num_gpus"),
        ({"accelerator_type": "TPU-V4"}, r"accelerator_type='TPU-V4' without resources"),
        ({"accelerator_type": "TPU-V9", "resources": {"TPU": 4}}, r"unknown TPU generation 'v9'; allowed: TPU-V4"),
        ({"resources": {"CPU": 2}}, r"resources\['CPU'\]=2: use num_cpus"),
        ({"num_cpus": -1}, r"num_cpus=-1: expected a number >= 0"),
        ({"memory": "16g"}, r"memory='16g': expected a number"),
        ({"runtime_env": {"pip": ["x"]}}, r"runtime_env=.*environment_from_runtime_env"),
        ({"max_retries": 3}, r"max_retries=3: retries belong to the job"),
        ({"num_returns": 2}, r"num_returns=2: it has no Fray ResourceConfig equivalent. Allowed options: num_cpus"),
        ({"scheduling_strategy": "SPREAD"}, r"scheduling_strategy='SPREAD': no Fray equivalent"),
    ],
)
def test_options_without_an_equivalent_raise(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resources_from_ray_options(**kwargs)


def test_node_affinity_points_to_preemptible() -> None:
    class NodeAffinitySchedulingStrategy:  # Ray's class, by name
        node_id, soft = "abc", False

    with pytest.raises(ValueError, match="preemptible=False"):
        resources_from_ray_options(scheduling_strategy=NodeAffinitySchedulingStrategy())


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(TPU_CATALOG)), st.booleans())
def test_every_head_resource_maps_to_its_slice(tpu_type: str, with_chips: bool) -> None:
    spec = TPU_CATALOG[tpu_type]
    resources: dict[str, float] = {f"TPU-{tpu_type}-head": 1}
    if with_chips:
        resources["TPU"] = spec.chips_per_host
    rc = resources_from_ray_options(resources=resources, accelerator_type=f"TPU-{spec.generation.upper()}")
    assert rc.device == TpuConfig(tpu_type) and rc.device.chips_per_host == spec.chips_per_host


@given(st.sampled_from(sorted(t for t, s in TPU_CATALOG.items() if s.hosts == 1)))
def test_every_single_host_slice_is_inferred_from_its_chips(tpu_type: str) -> None:
    spec = TPU_CATALOG[tpu_type]
    rc = resources_from_ray_options(resources={"TPU": spec.chips}, accelerator_type=f"TPU-{spec.generation.upper()}")
    assert rc.device == TpuConfig(tpu_type)


@given(
    num_cpus=st.one_of(st.none(), st.floats(0, 512, allow_nan=False)),
    memory=st.one_of(st.none(), st.integers(1, 2**44)),
    num_gpus=st.one_of(st.none(), st.integers(0, 16)),
    head=st.one_of(st.none(), st.sampled_from(["node:__internal_head__", "head_node"])),
)
def test_plain_options_round_trip(
    num_cpus: float | None, memory: int | None, num_gpus: int | None, head: str | None
) -> None:
    rc = resources_from_ray_options(
        num_cpus=num_cpus, num_gpus=num_gpus, memory=memory, resources={head: 0.01} if head else None
    )
    assert rc.cpu == (1 if num_cpus is None else num_cpus)
    if memory is not None:
        assert rc.ram_bytes == memory  # exact bytes, never rounded
    assert rc.device == (GpuConfig("auto", num_gpus) if num_gpus else CpuConfig())
    assert rc.preemptible is (head is None)


@given(
    st.text(min_size=1, max_size=20).filter(
        lambda k: (
            k not in ("TPU", "node:__internal_head__", "head_node", "head")
            and not k.startswith(("TPU-", "accelerator_type:"))
        )
    ),
    st.floats(0.001, 100, allow_nan=False),
)
def test_any_custom_resource_is_refused_by_name(key: str, amount: float) -> None:
    with pytest.raises(ValueError) as err:
        resources_from_ray_options(resources={key: amount})
    assert repr(key) in str(err.value) and repr(amount) in str(err.value) and "allowed keys" in str(err.value)


def test_runtime_env_to_environment(tmp_path: Path) -> None:
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("# pinned\noptax>=0.2\n\n-e .\nchex\n")
    env = environment_from_runtime_env(
        {
            "env_vars": {"A": "1"},
            "pip": {"packages": ["six"], "pip_check": False},
            "uv": str(reqs),
            "working_dir": str(tmp_path),
            "_ray_commit": "abc",
        }
    )
    assert env is not None
    assert env.pip_packages == ("six", "optax>=0.2", "chex") and env.env_vars == {"A": "1"}
    assert env.workspace == str(tmp_path)
    assert environment_from_runtime_env(None) is None and environment_from_runtime_env({"_ray_commit": "x"}) is None
    with pytest.raises(ValueError, match=r"runtime_env\['conda'\].*allowed keys: env_vars, pip, uv, working_dir"):
        environment_from_runtime_env({"conda": "env.yaml"})
    with pytest.raises(ValueError, match=r"working_dir.*only a local directory"):
        environment_from_runtime_env({"working_dir": "gs://bucket/code.zip"})

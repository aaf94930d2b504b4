"""current_cluster() resolution, spec strings, the backend registry, and import hygiene."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fray_core import UnknownBackendError, cluster_from_spec, current_cluster, set_current_cluster, using_cluster
from fray_core.cluster import Cluster, parse_spec, register_backend
from fray_local import LocalCluster


@pytest.fixture(autouse=True)
def _no_global_default():
    set_current_cluster(None)
    yield
    set_current_cluster(None)


def test_default_is_a_cached_local_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FRAY_CLUSTER_SPEC", raising=False)
    c = current_cluster()
    assert isinstance(c, LocalCluster)
    assert current_cluster() is c


def test_spec_env_var_is_honoured_on_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAY_CLUSTER_SPEC", "local?tpu=v4-16:2,v5litepod-4:4")
    c = current_cluster()
    assert isinstance(c, LocalCluster) and c.fleet.model.capacity() == {"v4-16": 2, "v5litepod-4": 4}
    assert current_cluster() is c  # same spec, same object
    monkeypatch.setenv("FRAY_CLUSTER_SPEC", "local?tpu=v4-8:1")
    c2 = current_cluster()
    assert c2 is not c and c2.fleet.model.capacity() == {"v4-8": 1}


@pytest.mark.parametrize(
    "spec, pattern",
    [
        ("nope", r"cluster spec 'nope': unknown backend 'nope'; known backends: local, ray"),
        ("local?colour=blue", r"unknown option\(s\) 'colour'; allowed: tpu, jobs_dir"),
        ("local?tpu=v4-17:2", r"TpuConfig.type: unknown TPU type 'v4-17'"),
        ("local?tpu=v4-16:x", r"count of 'v4-16' must be an int"),
    ],
)
def test_bad_specs_raise_an_error_quoting_them(monkeypatch: pytest.MonkeyPatch, spec: str, pattern: str) -> None:
    monkeypatch.setenv("FRAY_CLUSTER_SPEC", spec)
    with pytest.raises(ValueError, match=pattern):
        current_cluster()


def test_using_cluster_overrides_env_and_nests(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("FRAY_CLUSTER_SPEC", "local?tpu=v4-8:1")
    a, b = LocalCluster(jobs_dir=str(tmp_path / "a")), LocalCluster(jobs_dir=str(tmp_path / "b"))
    with using_cluster(a):
        assert current_cluster() is a
        with using_cluster(b):
            assert current_cluster() is b
        assert current_cluster() is a
    assert current_cluster() not in (a, b)
    set_current_cluster(b)
    assert current_cluster() is b


def test_using_cluster_accepts_a_spec_string() -> None:
    with using_cluster("local?tpu=v4-16:1") as c:
        assert current_cluster() is c and c.fleet.model.capacity() == {"v4-16": 1}


def test_register_backend_by_name() -> None:
    made: list[dict[str, str]] = []

    class Dummy(LocalCluster):
        pass

    def factory(params: dict[str, str]) -> Cluster:
        made.append(params)
        return Dummy()

    register_backend("dummy", factory)
    c = cluster_from_spec("dummy?x=1")
    assert isinstance(c, Dummy) and made == [{"x": "1"}] and c.spec == "dummy?x=1"


def test_backend_that_cannot_be_imported_is_a_clear_error() -> None:
    register_backend("broken", "no_such_module_for_fray_tests:_from_spec")
    with pytest.raises(
        UnknownBackendError,
        match=r"cluster spec 'broken': the 'broken' backend cannot be loaded "
        r"\(ModuleNotFoundError: No module named 'no_such_module_for_fray_tests'\)",
    ):
        cluster_from_spec("broken")


def test_detached_launch_default_follows_jobs_outlive_client() -> None:
    from fray_core.errors import FrayError

    launched = []

    class Outlives(LocalCluster):
        jobs_outlive_client = True

        def launch(self, request):  # type: ignore[no-untyped-def]
            launched.append(request)
            return "id-1"

    class Bound(Outlives):
        jobs_outlive_client = False

    assert Cluster.launch_detached(Outlives(jobs_dir="memory://x"), "req") == "id-1"  # type: ignore[arg-type]
    with pytest.raises(FrayError, match="cannot keep a job running after the launching process exits"):
        Cluster.launch_detached(Bound(jobs_dir="memory://x"), "req")  # type: ignore[arg-type]
    assert launched == ["req"]


def test_parse_spec() -> None:
    assert parse_spec("ray?address=10.0.0.1:6379&namespace=ns") == (
        "ray",
        {"address": "10.0.0.1:6379", "namespace": "ns"},
    )
    with pytest.raises(UnknownBackendError, match="given twice"):
        parse_spec("ray?address=a&address=b")


def test_importing_core_and_local_never_imports_ray() -> None:
    # (how long the import takes is measured by bench/import_cost.py, not asserted here)
    code = (
        "import sys, fray_core, fray_local, fray_local.testing; print(sorted(m for m in sys.modules if "
        "m.split('.')[0] == 'ray'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

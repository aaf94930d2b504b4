"""Connections that fail fast and say why (no Ray cluster is started here): an address that refuses, one
that does not answer, a port that is not a Ray GCS, a cluster that refuses this client's token and one of
another Ray version each fail within seconds naming the address and the reason, in the API and the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import pytest

ray = pytest.importorskip("ray")
grpc = pytest.importorskip("grpc")

from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc  # noqa: E402

from fray_ray.connect import RayConnectionError, check_ray_address  # noqa: E402

BOUND = 15.0  # seconds: the bound for any failing connection


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeGcs(gcs_service_pb2_grpc.InternalKVGcsServiceServicer):
    """Answers the cluster-metadata lookup as a GCS of ``ray_version`` would, or refuses unauthenticated calls."""

    def __init__(self, ray_version: str, token: str | None = None) -> None:
        self.ray_version = ray_version
        self.token = token

    def InternalKVGet(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        if (
            self.token is not None
            and dict(context.invocation_metadata()).get("authorization") != f"Bearer {self.token}"
        ):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "Invalid or missing authentication token")
        meta = {"ray_version": self.ray_version, "python_version": ".".join(map(str, sys.version_info[:3]))}
        return gcs_service_pb2.InternalKVGetReply(value=json.dumps(meta).encode())


@pytest.fixture
def fake_gcs(request: pytest.FixtureRequest) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    gcs_service_pb2_grpc.add_InternalKVGcsServiceServicer_to_server(FakeGcs(*request.param), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def fails_fast(address: str, *match: str, timeout: float | None = None) -> str:
    start = time.monotonic()
    with pytest.raises(RayConnectionError) as e:
        check_ray_address(address) if timeout is None else check_ray_address(address, timeout=timeout)
    took = time.monotonic() - start
    assert took < BOUND, took
    message = str(e.value)
    assert address in message and all(m in message for m in match), message
    return message


def test_a_refusing_address_fails_at_once_naming_it() -> None:
    fails_fast(f"127.0.0.1:{free_port()}", "connection refused")


def test_a_port_that_is_not_a_ray_gcs_fails_within_the_deadline() -> None:
    with socket.socket() as listener:  # accepts, never speaks
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        fails_fast(f"127.0.0.1:{listener.getsockname()[1]}", "not a Ray cluster's GCS", timeout=2.0)


@pytest.mark.parametrize("fake_gcs", [("2.9.3",)], indirect=True)
def test_a_cluster_of_another_ray_version_is_named_with_both_versions(fake_gcs: str) -> None:
    fails_fast(fake_gcs, "version mismatch", "Ray 2.9.3", f"Ray {ray.__version__}")


@pytest.mark.parametrize("fake_gcs", [(ray.__version__, "s3cret")], indirect=True)
def test_a_cluster_that_refuses_the_clients_token_says_so(fake_gcs: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", os.devnull)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    fails_fast(fake_gcs, "refused this client", "has none", "RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong")
    fails_fast(fake_gcs, "token was refused")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "s3cret")
    check_ray_address(fake_gcs)  # the right token: no complaint


@pytest.mark.parametrize("fake_gcs", [(ray.__version__,)], indirect=True)
def test_a_gcs_of_this_version_passes(fake_gcs: str) -> None:
    check_ray_address(fake_gcs)


def test_fray_launch_on_an_unreachable_address_is_one_line_and_quick(tmp_path: Any) -> None:
    """What a user typed (issue 28): ran for 10 minutes; now one line, exit code 2, within seconds."""
    (tmp_path / "train.py").write_text("def main():\n    return 1\n")
    address = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.getcwd(), str(tmp_path)]),
        "FRAY_JOBS_DIR": str(tmp_path / "jobs"),
    }
    env.pop("RAY_ADDRESS", None)
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "fray_core.cli", "launch", "--cluster", f"ray?address={address}", "train:main"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert time.monotonic() - start < BOUND + 5.0  # the CLI's own start-up on a loaded machine
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and address in lines[0] and "refused" in lines[0] and "jobs" not in lines[0], out.stderr

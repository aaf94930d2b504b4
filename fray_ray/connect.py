"""Connecting to a Ray cluster that fails fast and says why.

``ray.init(address=...)`` against an address nothing listens on, a firewalled one, or a port that is not a
Ray GCS retries for minutes, printing a warning every few seconds. Before it, :func:`check_ray_address`
asks the address itself, within a deadline, what Ray would learn slowly: is something listening (refused,
no answer), is it a Ray GCS, does it take this client's token (Ray's token authentication), and is it the
same Ray and Python version as this client. Each failure is a :class:`RayConnectionError` naming the
address and the reason.

Example::

    from fray_ray.connect import check_ray_address
    check_ray_address("10.0.0.1:6379")          # raises RayConnectionError, e.g. "... connection refused"
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from fray_core.errors import FrayError

__all__ = ["CONNECT_TIMEOUT", "RayConnectionError", "check_ray_address", "connected_gcs_address", "resolve_address"]

CONNECT_TIMEOUT = 10.0  # seconds the whole check may take (the bound is 15 s)


class RayConnectionError(FrayError):
    """The Ray cluster at an address cannot be used; the message names the address and why."""


def resolve_address(address: str | None) -> str | None:
    """The address ``ray.init`` would connect to: ``address``, else ``$RAY_ADDRESS`` for ``"auto"``/``None``;
    ``None`` when that is the local cluster Ray finds by itself (``ray start`` on this machine).

    >>> resolve_address("10.0.0.1:6379")
    '10.0.0.1:6379'
    """
    if address in (None, "", "auto"):
        env = os.environ.get("RAY_ADDRESS", "").strip()
        return env if env and env != "auto" else None
    return address


def connected_gcs_address() -> str | None:
    """The GCS address of the cluster this process is connected to, else ``None``. Never connects: Ray's
    ``get_runtime_context()`` runs ``ray.init()`` when not connected, which joins whatever cluster
    ``/tmp/ray/ray_current_cluster`` names or starts one (a test's process was left a driver of another
    test's cluster that way, and exited when that cluster went away).

    >>> connected_gcs_address() is None  # not connected: and still not, after asking
    True
    """
    try:
        import ray

        if not ray.is_initialized():
            return None
        return ray.get_runtime_context().gcs_address or None
    except Exception:  # an older Ray without it, or Ray client mode
        return None


def _token() -> str | None:
    """This client's Ray authentication token, where Ray looks for it (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise RayConnectionError(
            f"Ray address {address!r} is not HOST:PORT (e.g. 10.0.0.1:6379, or 'auto' for the local cluster)"
        )
    return host.strip("[]"), int(port)


def check_ray_address(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Raise :class:`RayConnectionError` unless a Ray GCS of this client's Ray and Python version answers
    at ``address`` (``HOST:PORT``; ``ray://HOST:PORT``, Ray Client, is checked for a listener only) within
    ``timeout`` seconds."""
    end = time.monotonic() + timeout
    client = address.startswith("ray://")
    host, port = _split(address[len("ray://") :] if client else address)
    try:
        with socket.create_connection((host, port), timeout=max(0.1, min(5.0, end - time.monotonic()))):
            pass
    except TimeoutError:
        raise RayConnectionError(
            f"cannot reach the Ray cluster at {address}: no answer within {min(5.0, timeout):g} s (wrong "
            f"address, or a firewall)"
        ) from None
    except OSError as e:
        why = (
            "connection refused (nothing listens there: is the head node up, and is this its GCS port, "
            "6379 by default?)"
            if e.errno == errno.ECONNREFUSED
            else (e.strerror or str(e))
        )
        raise RayConnectionError(f"cannot reach the Ray cluster at {address}: {why}") from None
    if client:
        return
    _check_gcs(address, end)


def _check_gcs(address: str, end: float) -> None:
    import grpc
    import ray
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = grpc.insecure_channel(address)
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=max(0.1, end - time.monotonic()))
        except grpc.FutureTimeoutError:
            raise RayConnectionError(
                f"{address} answers but is not a Ray cluster's GCS (no gRPC there; the dashboard's port is "
                f"not the address)"
            ) from None
        token = _token()
        metadata = [("authorization", f"Bearer {token}")] if token else None
        request = gcs_service_pb2.InternalKVGetRequest(key=b"CLUSTER_METADATA", namespace=b"cluster")
        try:
            reply = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel).InternalKVGet(
                request, timeout=max(0.1, end - time.monotonic()), metadata=metadata
            )
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                how = "this client's token was refused" if token else "it requires a token and this client has none"
                raise RayConnectionError(
                    f"the Ray cluster at {address} refused this client: {how} (Ray token authentication: "
                    f"set RAY_AUTH_TOKEN "
                    "or ~/.ray/auth_token to the cluster's token)"
                ) from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise RayConnectionError(
                    f"the Ray cluster at {address} did not answer within the connect timeout"
                ) from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise RayConnectionError(f"{address} is a gRPC server but not a Ray GCS") from None
            details = e.details() if hasattr(e, "details") else str(e)
            raise RayConnectionError(
                f"cannot use the Ray cluster at {address}: {code.name if code else 'error'}: {details}"
            ) from None
        if reply.status.code != 0:  # the GCS answered with an error of its own (e.g. not found: an old cluster)
            return
        try:
            meta = json.loads(reply.value.decode())
        except ValueError:
            return  # no metadata to compare: ray.init decides
        mine = (ray.__version__, ".".join(map(str, sys.version_info[:3])))
        theirs = (meta.get("ray_version"), meta.get("python_version"))
        if theirs[0] and theirs[0] != mine[0] or theirs[1] and theirs[1].split(".")[:2] != mine[1].split(".")[:2]:
            raise RayConnectionError(
                f"version mismatch with the Ray cluster at {address}: the cluster runs Ray {theirs[0]} on "
                f"Python {theirs[1]}, "
                f"this client Ray {mine[0]} on Python {mine[1]} (install the cluster's versions here)"
            )
    finally:
        channel.close()

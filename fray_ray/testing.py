"""An emulated multi-node Ray TPU cluster on one machine, for tests, demos and benchmarks.

Every emulated TPU host is a real Ray node (its own raylet) carrying exactly what Ray gives a real TPU VM:
the ``TPU`` resource, ``accelerator_type:TPU-V4``, the slice-name resource, ``TPU-<type>-head`` on worker 0,
the four ``ray.io/tpu-*`` labels and the ``TPU_*`` env vars (see ray-tpu-facts.md). A preemption removes the
slice's nodes without grace, as a real preemption does.

Example::

    from fray_ray.testing import fake_tpu_cluster

    with fake_tpu_cluster({"v4-16": 2}) as fake:
        job_id = fake.cluster.launch(request)
        fake.preempt(fake.cluster.poll(job_id).attempts[0].slices[0], restore_after=0.0)
        fake.cluster.wait(job_id, timeout=300)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from fray_core.limits import check_seconds
from fray_core.runner import RetryPolicy
from fray_core.tpu import get_tpu_spec
from fray_core.types import JobStatus

__all__ = ["FakeTpuCluster", "IsolationUnavailable", "fake_tpu_cluster", "tpu_node_args", "FAST_RAY_POLICY"]

#: Short backoff and deadlines, so tests of retries do not wait for production timings.
FAST_RAY_POLICY = RetryPolicy(
    backoff_initial=0.2,
    backoff_max=2.0,
    schedule_timeout=120.0,
    poll_interval=0.25,
    cancel_grace=10.0,
    host_start_timeout=60.0,
)

_GIB = 1024**3
LEAK_GRACE = 10.0  # seconds cleanup() gives placement groups to go before it calls them left behind

# The ports a node's raylet and agents listen on, chosen here and never used twice in one process. Left to
# the kernel, a new node can get the port of a node removed minutes before; the head's gRPC channel to that
# address is then still backing off after its failed reconnects, so every health check of the new node fails
# at once and the head declares it dead within seconds ("mistakenly been marked as dead", seen in CI after a
# restore): a slice with a host missing, forever. Real hosts have their own addresses.
_PORTS_PER_NODE = (
    "node_manager_port",
    "object_manager_port",
    "metrics_agent_port",
    "metrics_export_port",
    "runtime_env_agent_port",
    # not Ray's fixed 52365: beside another emulated cluster (a bench script's beside the test session's), a
    # head whose agent found it taken could not run Ray job submission (CI 2026-11-27)
    "dashboard_agent_listen_port",
)
_PORT_RANGE = (20000, 32000)  # below Linux's ephemeral range (32768-60999), which the kernel hands out itself
_used_ports: set[int] = set()
_port_lock = threading.Lock()
_next_port = itertools.count(random.randrange(*_PORT_RANGE))
_env_dirs = itertools.count()  # each emulated host's own runtime_env dir (a restored slice may reuse a name)


def _fresh_port() -> int:
    """A port no node of this process has had, free now (a bind succeeds)."""
    with _port_lock:
        for _ in range(_PORT_RANGE[1] - _PORT_RANGE[0]):
            port = _PORT_RANGE[0] + (next(_next_port) - _PORT_RANGE[0]) % (_PORT_RANGE[1] - _PORT_RANGE[0])
            if port in _used_ports:
                continue
            _used_ports.add(port)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("", port))
                except OSError:
                    continue  # someone else's
            return port
    raise RuntimeError(f"fake_tpu_cluster: no unused port left in {_PORT_RANGE}")


def _fresh_ports() -> dict[str, int]:
    return {key: _fresh_port() for key in _PORTS_PER_NODE}


@contextlib.contextmanager
def _spawning_without_python_in_child() -> Iterator[None]:
    """While inside, the processes Ray starts for a node (raylet, log monitor) run no Python between fork and
    exec.

    Ray starts each with ``preexec_fn`` (block SIGINT; with fate-sharing, ``PR_SET_PDEATHSIG``), and a
    ``preexec_fn`` makes CPython run every ``os.register_at_fork`` hook in the child too. This process is
    full of threads (Ray's gRPC, a test's pools), so a hook that allocates (filelock 4's resets its class
    registry) can find a lock another thread held at the fork and crash the child: CI of a07d3eb printed
    ``Fatal Python error: Segmentation fault`` from such a child, a raylet that never started (its slice
    then waited out ``_wait_for_node``). The same two effects without Python in the child: SIGINT blocked
    in the spawning thread (the child inherits its mask through exec) and ``setpriv --pdeathsig KILL``
    in front of the command. A ``preexec_fn`` this does not recognise is kept as Ray wrote it."""
    import signal

    from ray._private import services

    original = services.ConsolePopen
    setpriv = shutil.which("setpriv")

    def popen(args: Any, *rest: Any, preexec_fn: Any = None, **kwargs: Any) -> Any:
        if preexec_fn is None or rest:
            return original(args, *rest, preexec_fn=preexec_fn, **kwargs)
        code = getattr(preexec_fn, "__code__", None)
        cells = dict(zip(code.co_freevars, preexec_fn.__closure__ or ())) if code is not None else {}
        if code is None or code.co_name != "preexec_fn" or set(cells) != {"fate_share"}:
            return original(args, preexec_fn=preexec_fn, **kwargs)  # not the one known: Ray's own way
        command = list(args)
        if cells["fate_share"].cell_contents:
            if setpriv is None:
                return original(args, preexec_fn=preexec_fn, **kwargs)
            # the parent whose death kills it is the spawning thread, as with Ray's prctl in the child: Ray
            # fate-shares only from the main thread (spawn_reaper), so this stays as Ray meant it
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return original(command, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    services.ConsolePopen = popen
    try:
        yield
    finally:
        services.ConsolePopen = original


def tpu_node_args(
    tpu_type: str, slice_name: str, worker_id: int, num_cpus: int = 1, lockfile: str | None = None, labels: bool = True
) -> dict[str, Any]:
    """``add_node`` arguments that make a Ray node look like worker ``worker_id`` of a TPU slice
    (``lockfile``: where the host's libtpu lockfile is, instead of ``/tmp/libtpu_lockfile``; ``labels=False``:
    without the ``ray.io/tpu-*`` labels, as KubeRay without its webhook or an older Ray shows a TPU host)."""
    spec = get_tpu_spec(tpu_type)
    resources: dict[str, float] = {
        "TPU": float(spec.chips_per_host),
        spec.accelerator_resource: 1.0,
        slice_name: 1.0,
    }
    if worker_id == 0:
        resources[spec.head_resource] = 1.0
    node_labels = {
        "ray.io/tpu-slice-name": slice_name,
        "ray.io/tpu-worker-id": str(worker_id),
        "ray.io/tpu-pod-type": spec.name,
        "ray.io/tpu-topology": spec.topology,
    }
    env = {
        "TPU_NAME": slice_name,
        "TPU_WORKER_ID": str(worker_id),
        "TPU_ACCELERATOR_TYPE": spec.name,
        "TPU_TOPOLOGY": spec.topology,
    }
    if lockfile is not None:
        env["FRAY_TPU_LOCKFILE"] = lockfile
    return {
        "num_cpus": num_cpus,
        "memory": 16 * _GIB,  # logical only: enough for any one host's request
        "object_store_memory": 80 * 1024 * 1024,
        "resources": resources,
        "labels": node_labels if labels else {},
        "env_vars": env,
    }


class IsolationUnavailable(RuntimeError):
    """``fake_tpu_cluster(isolated=True)`` on a machine where this process cannot make mount namespaces (not
    root, no ``unshare``, a container that forbids it): tests skip, saying so, rather than pass unisolated."""


# Run in each isolated host's own mount namespace before its raylet (so in its workers too): a private /tmp,
# the client's working tree and home hidden, fray from a copy (as installed on a real host, not the client's
# checkout). What stays shared: the Ray session dir (the raylet's sockets and logs, which the client's own
# node reads, as Ray's log monitor would; the GCS is TCP), /dev/shm (each raylet's object store) and /proc.
# Python itself stays where it is, put back inside a hidden directory when it lies there (CI's venv is
# .ci/.venv in the checkout): the host's interpreter, as a real host has one installed, and nothing else.
# So do the ``shared`` directories a test harness names (its own gate files, like a shared mount), stashed
# before /tmp is replaced, since they may lie in it.
_ISOLATE_SH = r"""set -e
IFS='
'
i=0
for k in $FRAY_ISO_KEEP; do mount --bind "$k" "$FRAY_ISO_STASH-keep/$i"; i=$((i+1)); done
mount --bind "$FRAY_ISO_SESSION" "$FRAY_ISO_STASH"
mount -t tmpfs -o size=512m,mode=1777 fray-host-tmp /tmp
mkdir -p "$FRAY_ISO_SESSION"
mount --bind "$FRAY_ISO_STASH" "$FRAY_ISO_SESSION"
for d in $FRAY_ISO_HIDE; do mount -t tmpfs -o size=1m,mode=755 fray-hidden "$d"; done
i=0
for k in $FRAY_ISO_KEEP; do mkdir -p "$k"; mount --bind "$FRAY_ISO_STASH-keep/$i" "$k"; i=$((i+1)); done
export PYTHONPATH="$FRAY_ISO_SITE"
export PATH="$FRAY_ISO_BIN:$PATH"
unset FRAY_ISO_SESSION FRAY_ISO_STASH FRAY_ISO_HIDE FRAY_ISO_KEEP FRAY_ISO_SITE FRAY_ISO_BIN
exec "$@"
"""


@attrs.define(eq=False)
class _Isolation:
    """Starts the raylets of isolated hosts in mount namespaces of their own (see :data:`_ISOLATE_SH`)."""

    root: str  # outside /tmp: the fray copy and the mount point each namespace puts the session dir on
    hide: list[str]
    keep: list[str] = attrs.field(factory=list)  # Python's own directories inside a hidden one: put back
    active: bool = False  # set while isolated hosts are being added

    @staticmethod
    def check() -> None:
        """Raise :class:`IsolationUnavailable` saying why this process cannot isolate hosts."""
        import subprocess

        if sys.platform != "linux" or shutil.which("unshare") is None:
            raise IsolationUnavailable("fake_tpu_cluster(isolated=True): needs Linux and unshare(1)")
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "mount -t tmpfs none /tmp"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if probe.returncode != 0:
            raise IsolationUnavailable(
                "fake_tpu_cluster(isolated=True): this process cannot make a mount namespace "
                f"({(probe.stderr or probe.stdout).strip() or probe.returncode}); run as root, or where unshare "
                "is allowed"
            )

    @classmethod
    def make(cls, shared: Sequence[str] = ()) -> _Isolation:
        """A copy of fray as every isolated host has it installed, and the paths of the client to hide;
        ``shared``: directories every host still sees (see :func:`fake_tpu_cluster`)."""
        import importlib.util

        root = tempfile.mkdtemp(prefix="fray-isolated-", dir="/run" if os.access("/run", os.W_OK) else "/var/tmp")
        os.makedirs(os.path.join(root, "session"))
        # found, not imported: no backend imports another (fray_local goes along as part of what is installed,
        # and fray, the package marin's code imports, as well)
        for name in ("fray_core", "fray_local", "fray_ray", "fray"):
            spec = importlib.util.find_spec(name)
            src = os.path.dirname((spec.origin if spec else None) or "")
            shutil.copytree(
                src, os.path.join(root, "site", os.path.basename(src)), ignore=shutil.ignore_patterns("__pycache__")
            )
        keep = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, root)]
        candidates = {os.path.realpath(os.getcwd()), os.path.realpath(os.path.expanduser("~"))}
        candidates.update(
            os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p)
        )
        hide = sorted(
            p
            for p in candidates
            if p != "/"
            and os.path.isdir(p)
            and "\n" not in p
            and not p.startswith("/tmp/")
            # never Python's own directory or one inside it (one holding it is hidden, Python put back)
            and not any(k == p or p.startswith(k + os.sep) for k in keep)
            and not keep[2].startswith(p + os.sep)
        )
        # a venv inside a hidden directory (CI's .ci/.venv in the checkout): the hosts need that Python
        inside = sorted({k for k in keep[:2] if any(k.startswith(h + os.sep) for h in hide)})
        if any("\n" in k for k in inside):
            shutil.rmtree(root, ignore_errors=True)
            raise IsolationUnavailable(f"fake_tpu_cluster(isolated=True): a newline in Python's path {inside}")
        kept = inside + sorted({os.path.realpath(p) for p in shared} - set(inside))
        if any("\n" in k for k in kept):
            shutil.rmtree(root, ignore_errors=True)
            raise IsolationUnavailable(f"fake_tpu_cluster(isolated=True): a newline in a shared path {kept}")
        for i in range(len(kept)):
            os.makedirs(os.path.join(root, f"session-keep/{i}"))
        return cls(root=root, hide=hide, keep=kept)

    def wrap(self, command: list[str]) -> list[str]:
        session = next((c.split("=", 1)[1] for c in command if c.startswith("--session_dir=")), None)
        if session is None:
            raise RuntimeError(
                f"fake_tpu_cluster(isolated=True): no --session_dir in the raylet's command {command[:2]}"
            )
        return [
            "env",
            f"FRAY_ISO_SESSION={session}",
            f"FRAY_ISO_STASH={os.path.join(self.root, 'session')}",
            f"FRAY_ISO_HIDE={chr(10).join(self.hide)}",
            f"FRAY_ISO_KEEP={chr(10).join(self.keep)}",
            f"FRAY_ISO_SITE={os.path.join(self.root, 'site')}",
            # the host's Python first on its PATH, as installed there: the client's may be a shim in its
            # home (pyenv), which a host does not have
            f"FRAY_ISO_BIN={os.path.dirname(sys.executable)}",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            _ISOLATE_SH,
            "sh",
            *command,
        ]

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """While inside, raylets this process starts are isolated (Ray starts them with
        ``services.start_ray_process``, looked up at call time)."""
        from ray._private import services

        original = services.start_ray_process

        def start(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
            if process_type == "raylet":
                command = self.wrap(list(command))
            return original(command, process_type, *args, **kwargs)

        services.start_ray_process = start
        try:
            yield
        finally:
            services.start_ray_process = original


@attrs.define(eq=False)
class FakeTpuCluster:
    """What :func:`fake_tpu_cluster` yields: ``.cluster`` (a connected ``RayCluster``), ``.address``,
    ``.preempt(slice_name, restore_after=0.0)``, ``.kill_host(slice_name, host)``, ``.slices()`` (live
    slice names by type), ``.wait_settled()`` and
    ``.lockfile(slice_name, host)`` (each emulated host has its own libtpu lockfile: a process holding it
    open makes that host's TPU device busy)."""

    ray_cluster: Any  # ray.cluster_utils.Cluster
    cluster: Any  # fray_ray.RayCluster
    address: str
    state_dir: str = ""  # the hosts' lockfiles live under it
    _nodes: dict[str, list[Any]] = attrs.field(factory=dict)
    _types: dict[str, str] = attrs.field(factory=dict)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _counter: Any = attrs.field(factory=lambda: itertools.count())
    _threads: list[threading.Thread] = attrs.field(factory=list)
    _closed: threading.Event = attrs.field(factory=threading.Event)
    _removed: list[str] = attrs.field(factory=list)  # node ids of preempted hosts
    labels: bool = True  # new slices carry the ray.io/tpu-* labels (False: resources only)
    _isolation: _Isolation | None = None  # isolated=True: each TPU host in its own mount namespace

    def add_slice(
        self, tpu_type: str, wait: bool = True, tries: int = 1, name: str | None = None, labels: bool | None = None
    ) -> str:
        """Add a fresh slice of ``tpu_type`` (all of its hosts); returns its name.

        ``tries``: on a loaded machine a new raylet can die at start-up (its node agent did not answer in
        time), or not register with the GCS within Ray's own wait (``add_node`` raises "The current node
        timed out during startup", even without ``wait``: CI 2026-12-07, a bench smoke's cluster start beside
        100 forking processes); its nodes are then removed and a fresh slice is tried, up to ``tries`` times.
        ``name``: the slice's name (default a fresh one; a name that was used before is a slice that
        came back on new hardware, as a restarted KubeRay pod keeps its ``TPU_NAME``); ``labels``: with the
        ``ray.io/tpu-*`` labels (default: the cluster's setting)."""
        for left in range(tries - 1, -1, -1):
            try:
                return self._add_slice(tpu_type, wait, name, self.labels if labels is None else labels)
            except Exception:
                if left == 0:
                    raise
        raise AssertionError("unreachable")

    def _add_slice(self, tpu_type: str, wait: bool, name: str | None = None, labels: bool = True) -> str:
        spec = get_tpu_spec(tpu_type)
        name = name or f"fake-{spec.name}-{next(self._counter)}"
        if name in self._nodes:
            raise ValueError(f"add_slice: a live slice is named {name!r} already")
        main = threading.current_thread() is threading.main_thread()
        nodes: list[Any] = []
        try:
            with self._lock:
                # Ray registers signal handlers for a node's shutdown hooks, which only the main thread may do;
                # a slice restored from a timer thread goes without them (shutdown() still removes it).
                self.ray_cluster._shutdown_at_exit = main
                isolating = contextlib.ExitStack()
                isolating.enter_context(_spawning_without_python_in_child())
                if self._isolation is not None:
                    isolating.enter_context(self._isolation.starting())
                try:
                    for w in range(spec.hosts):
                        args = {
                            **tpu_node_args(spec.name, name, w, lockfile=self.lockfile(name, w), labels=labels),
                            **_fresh_ports(),
                        }
                        # each host its own runtime_env files (a job's shipped code), as on its own disk: a
                        # removed node's agent deletes what it unpacked, which other hosts would be using
                        args["runtime_env_dir_name"] = f"runtime_resources_{name}_h{w}_{next(_env_dirs)}"
                        nodes.append(self.ray_cluster.add_node(wait=False, **args))
                finally:
                    isolating.close()
                    self.ray_cluster._shutdown_at_exit = True
            if wait:
                for node in nodes:
                    self.ray_cluster._wait_for_node(node, timeout=60)
        except Exception:
            for node in nodes:  # a half-started slice is no slice: remove what came up
                self._removed.append(node.node_id)
                try:
                    self.ray_cluster.remove_node(node, allow_graceful=False)
                except Exception:
                    pass  # it never came up
            raise
        with self._lock:
            self._nodes[name] = nodes
            self._types[name] = spec.name
        return name

    def lockfile(self, slice_name: str, host: int) -> str:
        """Host ``host`` of ``slice_name``'s libtpu lockfile (the dir is made; the file is not)."""
        d = os.path.join(self.state_dir, slice_name, f"host{host}")
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, "libtpu_lockfile")

    def slices(self) -> dict[str, list[str]]:
        """Live slice names by TPU type."""
        out: dict[str, list[str]] = {}
        with self._lock:
            for name, t in self._types.items():
                out.setdefault(t, []).append(name)
        return out

    def preempt(self, slice_name: str, restore_after: float | None = 0.0) -> None:
        """Remove every node of ``slice_name`` at once, without grace (a preemption). After
        ``restore_after`` seconds a fresh slice of the same type (a new name) joins; ``None``: never."""
        restore_after = check_seconds("preempt: restore_after", restore_after)
        with self._lock:
            if slice_name not in self._nodes:
                raise KeyError(f"preempt: no live slice named {slice_name!r}; live: {sorted(self._nodes)}")
            nodes = self._nodes.pop(slice_name)
            tpu_type = self._types.pop(slice_name)
        for node in nodes:
            if node.node_id in self._removed:
                continue  # a host killed on its own (kill_host)
            self._removed.append(node.node_id)
            self.ray_cluster.remove_node(node, allow_graceful=False)
        if restore_after is None:
            return

        def restore() -> None:
            if self._closed.wait(restore_after):
                return
            self.add_slice(tpu_type, tries=3)

        t = threading.Thread(target=restore, daemon=True, name=f"fray-restore-{slice_name}")
        self._threads.append(t)
        t.start()

    def drain(self, slice_name: str, grace: float, restore_after: float | None = 0.0) -> float:
        """A preemption notice through Ray itself: every node of ``slice_name`` is drained with Ray's DrainNode
        (reason PREEMPTION and a deadline ``grace`` seconds away, what Ray's autoscaler and GKE maintenance
        events produce), then preempted (:meth:`preempt`, with ``restore_after``) at the deadline. Returns the
        deadline (epoch seconds)."""
        grace = check_seconds("drain: grace", grace, allow_none=False)
        restore_after = check_seconds("drain: restore_after", restore_after)
        import ray
        from ray.core.generated import autoscaler_pb2

        with self._lock:
            if slice_name not in self._nodes:
                raise KeyError(f"drain: no live slice named {slice_name!r}; live: {sorted(self._nodes)}")
            nodes = list(self._nodes[slice_name])
        deadline = time.time() + grace
        gcs = ray._private.worker.global_worker.gcs_client
        reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
        for node in nodes:
            accepted, why = gcs.drain_node(
                node.node_id, reason, f"{slice_name} preempted in {grace:g} s", int(deadline * 1000)
            )
            if not accepted:
                raise RuntimeError(f"drain: Ray rejected draining {node.node_id[:12]} of {slice_name}: {why}")

        def preempt_at_deadline() -> None:
            if self._closed.wait(max(0.0, deadline - time.time())):
                return
            with self._lock:
                live = slice_name in self._nodes
            if live:
                self.preempt(slice_name, restore_after)

        t = threading.Thread(target=preempt_at_deadline, daemon=True, name=f"fray-drain-{slice_name}")
        self._threads.append(t)
        t.start()
        return deadline

    def kill_host(self, slice_name: str, host: int) -> str:
        """Remove one host of ``slice_name`` without grace, leaving the rest of the slice up (a VM that
        died on its own); returns its node id. The slice is no capacity until :meth:`wait_settled`
        replaces it."""
        with self._lock:
            if slice_name not in self._nodes:
                raise KeyError(f"kill_host: no live slice named {slice_name!r}; live: {sorted(self._nodes)}")
            node = self._nodes[slice_name][host]
        self._removed.append(node.node_id)
        self.ray_cluster.remove_node(node, allow_graceful=False)
        return node.node_id

    def cleanup(self, timeout: float = 120.0) -> list[str]:
        """Leave the cluster as a fresh one: stop every job of ``.cluster``'s store that has not ended,
        kill the supervisor of any other job (another jobs dir) that still holds placement groups, wait
        until no ``fray-`` placement group is left, then :meth:`wait_settled`. Returns what it had to do,
        one line each (empty: nothing was left behind); a test fixture fails the test on a non-empty answer.

        >>> leftovers = fake.cleanup()  # doctest: +SKIP
        """
        import ray
        from ray.util.placement_group import placement_group_table

        done: list[str] = []
        end = time.monotonic() + timeout
        for info in self.cluster.list_jobs():
            if info.status in (JobStatus.PENDING, JobStatus.RUNNING):
                done.append(f"job {info.job_id} was still {info.status.value}: terminated")
                try:
                    self.cluster.terminate(info.job_id)
                except Exception as e:  # its supervisor is stuck: killed by terminate; the groups check decides
                    done.append(f"  terminate {info.job_id}: {type(e).__name__}: {e}")

        def groups() -> dict[str, str]:
            return {
                pg["name"]: pg["state"]
                for pg in placement_group_table().values()
                if (pg.get("name") or "").startswith("fray-") and pg.get("state") != "REMOVED"
            }

        settle = time.monotonic() + LEAK_GRACE  # a group removed at the job's end may still be on its way out
        while groups() and time.monotonic() < settle:
            time.sleep(0.1)
        left = groups()
        if left:
            done.append(f"placement groups not removed: {', '.join(f'{n} ({st})' for n, st in sorted(left.items()))}")
            for name in ray.util.list_named_actors(all_namespaces=True):
                if name["name"].startswith("fray-supervisor-"):
                    try:
                        actor = ray.get_actor(name["name"], namespace=name["namespace"])
                        jobs = ray.get(actor.ping.remote(), timeout=10)
                    except Exception:
                        continue
                    leaking = [job for job in jobs if any(n.startswith(f"fray-{job}-") for n in left)]
                    if leaking:
                        done.append(f"  killed the supervisor of {', '.join(leaking)}")
                        ray.kill(actor, no_restart=True)
        while groups():
            if time.monotonic() >= end:
                done.append(f"placement groups still there after {timeout:.0f} s: {', '.join(sorted(groups()))}")
                break
            time.sleep(0.2)
        self.wait_settled(max(1.0, end - time.monotonic()))
        return done

    def _replace_dead_hosts(self) -> None:
        """Watchdog (a thread of :func:`fake_tpu_cluster`): a host whose raylet exited without being removed
        or killed (on a loaded 2-core machine a raylet can die when its agents start too slowly) takes its
        slice with it and a fresh slice of the type joins, as a real cluster's node pool replaces a dead VM.
        Without it a job waiting for that slice waits for its whole bound and every later test of the session
        finds one slice short. Hosts a test killed on purpose (:meth:`kill_host`) are left alone."""
        while not self._closed.wait(1.0):
            with self._lock:
                broken = [
                    (name, hosts)
                    for name, hosts in self._nodes.items()
                    if any(h.node_id not in self._removed and _raylet_gone(h) for h in hosts)
                ]
            for name, hosts in broken:
                print(f"fake_tpu_cluster: a host of {name} died on its own; replacing the slice", file=sys.stderr)
                for h in hosts:
                    if _raylet_gone(h):
                        print(_death_report(h), file=sys.stderr)
                try:
                    self.preempt(name, restore_after=0.0)
                except KeyError:
                    pass  # a test removed it meanwhile

    def wait_restored(self, timeout: float = 120.0) -> None:
        """Block until every pending restore has added its slice (or ``timeout``)."""
        end = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, end - time.monotonic()))

    def wait_settled(self, timeout: float = 120.0) -> None:
        """Block until every restore is done, Ray reports every removed host dead, and every live slice
        has all of its hosts alive.

        A removed node looks alive to Ray for 12-15 s (ray-tpu-facts.md): work scheduled on it then dies
        the way preempted work does. Tests that must not see a preemption start from a settled cluster.
        A host that died without being removed (its raylet declared dead under load) leaves a slice with
        a host missing; that slice is replaced by a fresh one of its type (a new name), and said so on
        stderr, so one bad instant of the machine does not spoil every later test of the session.
        """
        import ray

        end = time.monotonic() + timeout
        self.wait_restored(timeout)
        while True:
            nodes = ray.nodes()
            alive = {n["NodeID"] for n in nodes if n.get("Alive")}
            if not alive.intersection(self._removed):
                break
            if time.monotonic() >= end:
                raise TimeoutError(f"wait_settled: removed nodes still alive after {timeout}s")
            time.sleep(0.2)
        dead = {n["NodeID"] for n in nodes if not n.get("Alive")}
        with self._lock:
            # A raylet whose process is gone counts at once: Ray declares it dead only after its missed health
            # checks, and a test started in between would wait for a slice that never comes back (CI saw one
            # such host spoil every later test of the session).
            broken = [
                (name, self._types[name], hosts)
                for name, hosts in self._nodes.items()
                if any(h.node_id in dead or _raylet_gone(h) for h in hosts)
            ]
        for name, tpu_type, hosts in broken:
            print(f"fake_tpu_cluster: slice {name} lost a host it was not told to lose; replacing it", file=sys.stderr)
            for h in hosts:
                if h.node_id in dead or _raylet_gone(h):
                    print(_death_report(h), file=sys.stderr)
            self.preempt(name, restore_after=None)
            self.add_slice(tpu_type, tries=3)
        if broken:
            self.wait_settled(max(1.0, end - time.monotonic()))


def _raylet_gone(node: Any) -> bool:
    """Whether a host's raylet process has exited (not one we removed: those are no longer in ``_nodes``)."""
    try:
        return bool(node.dead_processes())
    except Exception:
        return False


def _death_report(node: Any, lines: int = 15) -> str:
    """What a host that died on its own left in its logs: the exit codes of its processes and the last lines of
    the raylet's logs, so a CI failure of the emulated cluster says why the host went."""
    out = [f"fake_tpu_cluster: host {node.node_id[:12]} died on its own"]
    try:
        for kind, proc in node.dead_processes():
            out.append(f"  {kind} pid {proc.pid} exited with {proc.poll()}")
        raylet = next((p for _, infos in node.all_processes.items() for p in infos if p.stderr_file), None)
        names = [raylet.stderr_file, raylet.stdout_file] if raylet is not None else []
        for path in names:
            if path and os.path.exists(path):
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-lines:]
                out.append(f"  -- {os.path.basename(path)} (last {len(tail)} lines)")
                out.extend("    " + t.rstrip()[:300] for t in tail)
    except Exception as e:  # a diagnostic must not turn a replaced slice into a failed test
        out.append(f"  (no logs: {type(e).__name__}: {e})")
    return "\n".join(out)


@contextlib.contextmanager
def fake_tpu_cluster(
    slices: dict[str, int],
    *,
    head_cpus: int = 4,
    retry_policy: RetryPolicy | None = None,
    namespace: str | None = None,
    jobs_dir: str | None = None,
    health_check_period: float | None = None,
    labels: bool = True,
    isolated: bool = False,
    shared: Sequence[str] = (),
) -> Iterator[FakeTpuCluster]:
    """Start a multi-node Ray cluster on this machine whose nodes are emulated TPU hosts.

    ``slices`` maps a TPU type to a slice count, e.g. ``{"v4-16": 2}`` (2 slices x 2 hosts). The head node
    is not a TPU host (supervisors and CPU work run there). Connects this process and yields a
    :class:`FakeTpuCluster`; shuts everything down on exit. Takes about 15 s on 2 cores for 4 hosts.

    ``health_check_period`` (seconds): how often the head checks each node; a removed node is reported
    dead after 4 missed checks. ``None`` keeps Ray's default (3 s x 5, about 15 s), as on a real cluster;
    tests use 1 s so that a slice lost before its hosts run is detected sooner.

    ``labels=False``: the hosts carry no ``ray.io/tpu-*`` labels, only the resources Ray gives a TPU VM (a
    cluster as KubeRay without its webhook, or an older Ray, shows it); fray finds the slices from those.

    ``isolated=True``: every TPU host is a machine of its own as far as files go: its raylet (and so its
    workers) runs in a mount namespace with a private ``/tmp`` (its own ``/tmp/libtpu_lockfile``), without
    this process's working directory, home or ``PYTHONPATH`` entries, and with fray from a copy (installed on
    the host, not the client's checkout); a job's own code reaches it only as Ray ships it. Shared still: the
    Ray session dir (each raylet's sockets and logs), ``/dev/shm`` and ``/proc``. The head node's raylet is
    isolated the same way (its workers are the supervisors and the scheduler): this process is a client that
    reaches the cluster by its address, and a job store on its disk only is one the cluster cannot read.
    Needs mount namespaces (root, ``unshare``): else
    :class:`IsolationUnavailable`, so a test skips saying why instead of passing unisolated. ``shared``:
    directories every node still sees, for a test harness's own files (the test's gate and marker files, as
    a shared mount would carry them); fray itself must never need one.

    Ray's idle worker pool is off (``num_workers_soft_limit`` 0): every node shares this machine's cores, so
    a worker Ray prestarts on the head slows the emulated hosts, which on a real cluster it would not.

    >>> with fake_tpu_cluster({"v4-16": 2}) as fake:  # doctest: +SKIP
    ...     fake.cluster.wait(fake.cluster.launch(request), timeout=300)
    """
    import ray
    from ray.cluster_utils import Cluster as RayTestCluster

    from fray_ray.cluster import RayCluster

    if ray.is_initialized():
        raise RuntimeError("fake_tpu_cluster: this process is already connected to Ray; call ray.shutdown() first")
    # No idle worker pool: a raylet that gets a lease request with a backlog (a driver submitting two host
    # tasks of one shape) prestarts workers for it up to its soft limit (its CPUs), even when the task can
    # only run elsewhere: the head started a worker for every hand-written launch, which competed with the
    # hosts for this machine's cores (on a real cluster it costs the head's own) and then sat idle until the
    # next actor took it. With a soft limit of 0 workers start on demand only and idle ones exit after 1 s.
    system_config: dict[str, Any] = {"num_workers_soft_limit": 0}
    if health_check_period is not None:
        period_ms = int(health_check_period * 1000)
        system_config.update(
            health_check_period_ms=period_ms,
            health_check_timeout_ms=2 * period_ms,
            health_check_failure_threshold=4,
        )
    head_args: dict[str, Any] = {
        "num_cpus": head_cpus,
        "memory": 16 * _GIB,
        "object_store_memory": 200 * 1024 * 1024,
        "_system_config": system_config,
        # not Ray's fixed 8265: a second emulated cluster on the machine (a bench script beside the test
        # session's) would find it taken and start without a dashboard, so without Ray job submission
        "dashboard_port": _fresh_port(),
        **_fresh_ports(),
    }
    isolation = None
    if isolated:
        _Isolation.check()
        isolation = _Isolation.make(shared)
    # isolated: the head too is a machine of its own (its raylet, so the supervisors and the scheduler, see
    # neither the client's files nor its /tmp); the client reaches it through the address, as from elsewhere
    with _spawning_without_python_in_child(), isolation.starting() if isolation else contextlib.nullcontext():
        rc = RayTestCluster(initialize_head=True, head_node_args=head_args)
    fake = FakeTpuCluster(
        ray_cluster=rc,
        cluster=None,
        address=rc.address,
        # isolated hosts see their own /tmp: their lockfiles live where every namespace sees the same files
        state_dir=tempfile.mkdtemp(prefix="fray-fake-tpu-", dir=isolation.root if isolation else None),
        labels=labels,
        isolation=isolation,
    )
    try:
        for tpu_type, count in slices.items():
            for _ in range(count):
                fake.add_slice(tpu_type, wait=False, tries=3)
        rc.wait_for_nodes(timeout=120)
        threading.Thread(target=fake._replace_dead_hosts, daemon=True, name="fray-fake-watchdog").start()
        fake.cluster = RayCluster(
            address=rc.address, namespace=namespace, retry_policy=retry_policy or FAST_RAY_POLICY, jobs_dir=jobs_dir
        )
        yield fake
    finally:
        fake._closed.set()
        if fake.cluster is not None:
            fake.cluster.close()
        ray.shutdown()
        rc.shutdown()
        shutil.rmtree(fake.state_dir, ignore_errors=True)
        if isolation is not None:
            shutil.rmtree(isolation.root, ignore_errors=True)

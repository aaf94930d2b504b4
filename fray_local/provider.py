"""The local ``SliceProvider``: every host is a real subprocess, TPU slices come from a ``TpuFleet``."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import cloudpickle

from fray_core._exits import describe_exit, exit_code_text
from fray_core._oom import OomWatch, oom_suffix
from fray_core.errors import Unschedulable
from fray_core.hostapi import read_heartbeat, write_notice
from fray_core.provider import (
    Heartbeat,
    HostOutcome,
    HostOutcomeKind,
    HostRun,
    HostSpec,
    LeaseHealth,
    SliceLease,
    SliceProvider,
)
from fray_core.request import Entrypoint, ResourceConfig, TpuConfig
from fray_core.scheduling import FairQueue, held_by, ordinal
from fray_core.signatures import device_fault
from fray_local._proc import STACKS, HostProcess, LogSink
from fray_local.fleet import TpuFleet

__all__ = ["HostBudget", "LocalSliceProvider", "LogSink"]

BUDGET_TTL = 5.0  # seconds a job's place in the host budget's line is kept between its runner's rounds (0.2 s)


class HostBudget:
    """The host processes a ``LocalCluster``'s jobs run at once: at most ``max_hosts``. A job's gang waits for
    its hosts in line (the shared :class:`~fray_core.scheduling.FairQueue`: first come, first served, with
    backfill), PENDING with the reason, for as long as it takes; the hosts come back when its attempt ends.

    >>> budget = HostBudget(4)
    >>> budget.take("a", [3], deadline=0.0)
    3
    >>> budget.take("b", [2], deadline=0.0)
    Traceback (most recent call last):
    ...
    fray_core.errors.Unschedulable: asked: 2 host processes; 1 of 4 free (LocalCluster.max_hosts)
    >>> budget.give_back("a", 3); budget.take("b", [2], deadline=0.0)
    2
    """

    def __init__(self, max_hosts: int) -> None:
        self.max_hosts = max_hosts
        self._cond = threading.Condition()
        self._held: dict[str, int] = {}  # job id -> its hosts running or about to start
        self._queue = FairQueue(ttl=BUDGET_TTL)

    @property
    def used(self) -> int:
        with self._cond:
            return sum(self._held.values())

    def take(self, holder: str, counts: Sequence[int], deadline: float, since: float | None = None) -> int:
        """The largest of ``counts`` (host numbers, largest first) ``holder`` may start now, held until
        :meth:`give_back`; else it waits in line until ``deadline`` (``time.monotonic``), then raises
        :class:`~fray_core.errors.Unschedulable` (``held``: the hosts exist, other jobs run them) whose
        reason is its place in line. ``since``: when the job was submitted (its place in line)."""
        if min(counts) > self.max_hosts:  # launch refuses such a job; never wait for what cannot come
            raise Unschedulable(
                f"asked: {min(counts):,} host processes; LocalCluster.max_hosts is {self.max_hosts:,}", permanent=True
            )
        with self._cond:
            while True:
                now = time.monotonic()
                free = self.max_hosts - sum(self._held.values())
                got = self._queue.admit(holder, counts, free, now, since=since)
                if got is not None:
                    self._held[holder] = self._held.get(holder, 0) + got
                    return got
                if now >= deadline:
                    place = self._queue.place(holder, now)
                    holders = [h for h, _ in sorted(self._held.items(), key=lambda kv: -kv[1])]
                    need = min(counts)
                    reason = (
                        f"queued{': ' + ordinal(place) if place else ''} for {need:,} host processes "
                        f"(LocalCluster.max_hosts {self.max_hosts:,}); "
                        + held_by(free, self.max_hosts - free, holders, where="host processes")
                    )
                    raise Unschedulable(
                        f"asked: {need:,} host processes; {free:,} of {self.max_hosts:,} free (LocalCluster.max_hosts)",
                        held=True,
                        reason=reason,
                    )
                self._cond.wait(max(0.0, min(deadline - now, BUDGET_TTL / 2)))

    def give_back(self, holder: str, hosts: int) -> None:
        """``holder``'s ``hosts`` ended (or never started): the jobs in line may have them."""
        if hosts <= 0:
            return
        with self._cond:
            left = self._held.get(holder, 0) - hosts
            if left > 0:
                self._held[holder] = left
            else:
                self._held.pop(holder, None)
            self._cond.notify_all()

    def leave(self, holder: str) -> None:
        """``holder`` stopped waiting (its job ended): the jobs behind it need not wait for its entry to expire."""
        with self._cond:
            self._queue.leave(holder)
            self._cond.notify_all()


class LocalSliceProvider(SliceProvider):
    """Runs one job's hosts as subprocesses. TPU slices are acquired from ``fleet``; a CPU/GPU gang is
    one pseudo-slice of ``replicas`` processes. Faults of the fleet's plan are applied at ``start``.
    ``submitted_at``: when the job was submitted, its place in the fleet's line."""

    def __init__(
        self,
        fleet: TpuFleet,
        job_id: str,
        job_dir: str,
        log: LogSink,
        workspace: str | None = None,
        gpu_devices: Sequence[Sequence[str]] | None = None,
        submitted_at: float | None = None,
        budget: HostBudget | None = None,
    ) -> None:
        self.fleet = fleet
        self.budget = budget  # the cluster's host processes at once (LocalCluster.max_hosts); None: no bound
        self._budgeted: list[SliceLease] = []  # leases whose hosts were taken from the budget, until released
        self.job_id = job_id
        self.job_dir = job_dir
        self.log = log
        self.cwd = os.path.abspath(workspace) if workspace else os.getcwd()
        self._cond = threading.Condition()
        self._hosts: dict[HostRun, HostProcess] = {}
        self._files: dict[HostRun, tuple[int, int]] = {}  # per host: (serial of its heartbeat file, attempt)
        self._oom: dict[HostRun, OomWatch | None] = {}  # per host: its cgroup's OOM kills before it started
        self.gpu_devices = gpu_devices  # CUDA_VISIBLE_DEVICES of each replica of a GPU job
        self.submitted_at = submitted_at
        self._seq = 0
        log.on_error(self._log_failed)

    # ------------------------------------------------------------------------------------- acquire

    def acquire(self, resources: ResourceConfig, counts: Sequence[int], deadline: float) -> list[SliceLease]:
        dev = resources.device
        per_slice = resources.hosts_per_replica
        if not isinstance(dev, TpuConfig):
            counts = [int(resources.replicas)]  # type: ignore[arg-type]  # a list of counts is for TPU slices only
        granted = None
        if self.budget is not None:
            # the hosts first (launch made sure the fewest fit the bound), then as many slices as they allow;
            # what the fleet does not give is given back at once
            fit = [c for c in counts if c * per_slice <= self.budget.max_hosts] or [min(counts)]
            granted = self.budget.take(self.job_id, [c * per_slice for c in fit], deadline, self.submitted_at)
            counts = [c for c in fit if c * per_slice <= granted]
        try:
            if isinstance(dev, TpuConfig):
                leases = self.fleet.acquire(self.job_id, dev.type, counts, deadline, since=self.submitted_at)
            else:
                n = counts[0]
                leases = [SliceLease(name="local", device_type=dev.kind, hosts=n, host_addresses=("127.0.0.1",) * n)]
        except BaseException:
            if granted is not None:
                self.budget.give_back(self.job_id, granted)  # type: ignore[union-attr]
            raise
        if granted is not None:
            used = sum(lease.hosts for lease in leases)
            self.budget.give_back(self.job_id, granted - used)  # type: ignore[union-attr]
            with self._cond:
                self._budgeted.extend(leases)
        return leases

    def release(self, leases: list[SliceLease]) -> None:
        for lease in leases:
            if lease.handle is not None:
                self.fleet.release(lease)
        if self.budget is not None:
            with self._cond:  # once per lease, however often it is released
                back = sum(lease.hosts for lease in self._budgeted if any(lease is x for x in leases))
                self._budgeted = [lease for lease in self._budgeted if not any(lease is x for x in leases)]
            self.budget.give_back(self.job_id, back)

    def was_preempted(self, lease: SliceLease) -> bool:
        return lease.handle is not None and self.fleet.was_preempted(lease)

    # --------------------------------------------------------------------------------------- start

    def start(self, lease: SliceLease, hosts: list[HostSpec], entrypoint: Entrypoint) -> list[HostRun]:
        attempt = hosts[0].attempt
        is_tpu = lease.handle is not None
        if is_tpu:
            self.fleet.start_slice(lease, attempt)  # the model arms the attempt's faults, once
        payload = os.path.join(self.job_dir, f"entry-a{attempt}.pkl")
        if not os.path.exists(payload):
            _write_payload(payload, entrypoint)
        runs: list[HostRun] = []
        # hosts are forked into this process's memory cgroup: its OOM kills from now on may be theirs
        oom = OomWatch.of()
        try:
            for spec in hosts:
                runs.append(self._start_host(lease, spec, payload, is_tpu))
                self._oom[runs[-1]] = oom
        except BaseException:
            # all or nothing (see SliceProvider.start): a host that could not be forked (EAGAIN) must not
            # leave its slice's earlier hosts running into the next attempt
            for run in runs:
                run.handle.cancelled = True
                run.handle.kill(wait=True)
            with self._cond:
                for run in runs:
                    self._hosts.pop(run, None)
            raise
        return runs

    def _start_host(self, lease: SliceLease, spec: HostSpec, payload: str, is_tpu: bool) -> HostRun:
        """Start one host's process; a transient start error (EAGAIN) is raised."""
        attempt, slice_index = spec.attempt, spec.slice_index
        h = spec.host_index
        tag = f"a{attempt} s{slice_index}/h{h}" if is_tpu else f"a{attempt} r{h}"
        full_env = dict(os.environ)
        full_env.update(spec.env)
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env["FRAY_SYS_PATH"] = json.dumps([self.cwd] + [p for p in sys.path if p])
        # tasks and jobs inside the job use the local backend (marin's jobs read it), unless the user set one
        full_env["FRAY_CLUSTER_SPEC"] = spec.env.get("FRAY_CLUSTER_SPEC") or "local"
        if is_tpu:
            sim_env, note = self.fleet.host_env(lease, h)
            if note:
                self.log.write(tag, note)
            full_env.update(sim_env)
        self._seq += 1
        result_path = os.path.join(self.job_dir, f"result-{self._seq}.pkl")
        # how fray_core.heartbeat() and preemption_notice() in the host reach us (see fray_core.hostapi)
        full_env["FRAY_HEARTBEAT_FILE"] = os.path.join(self.job_dir, f"heartbeat-{self._seq}")
        full_env["FRAY_NOTICE_FILE"] = os.path.join(self.job_dir, f"notice-a{attempt}")
        if lease.device_type == "gpu" and self.gpu_devices is not None:
            devices = ",".join(self.gpu_devices[h])
            full_env["CUDA_VISIBLE_DEVICES"] = devices
            self.log.write(tag, f"[fray] CUDA_VISIBLE_DEVICES={devices}")
        host = HostProcess(tag, self.log, self._notify, result_path)
        if self.log.error is not None:  # the log cannot be written: do not start what we cannot record
            host.log_error = self.log.error
            host.not_started(self.log.error)
        else:
            argv = [sys.executable, "-m", "fray_local._host", payload, result_path]
            host.start(argv, full_env, self.cwd, guardian=True)
        run = HostRun(lease=lease, slice_index=slice_index, host_index=h, handle=host)
        with self._cond:
            self._hosts[run] = host
            self._files[run] = (self._seq, attempt)  # its heartbeat and notice files
        if is_tpu and not self.fleet.register_kill(lease, lambda host=host: self._preempt_host(host)):
            self._preempt_host(host)  # the slice went away while we were starting
        return run

    def _preempt_host(self, host: HostProcess) -> None:
        host.preempted = True
        host.kill(wait=True)  # gone when the fleet's preempt() returns: no call reaches a preempted host

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _log_failed(self, error: str) -> None:
        """The job log cannot be written: fail the running hosts (a job we cannot record is not run)."""
        with self._cond:
            hosts = [h for h in self._hosts.values() if not h.done.is_set()]
        for host in hosts:
            host.log_error = error
            host.kill()

    # ---------------------------------------------------------------------------------------- wait

    def wait_any(self, runs: list[HostRun], timeout: float) -> list[HostOutcome]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                ended = []
                hidden = None  # the earliest instant a lost host, dead already, is detected
                for r in runs:
                    host = self._hosts[r]
                    if not host.done.is_set() or host.reported:
                        continue
                    seen = self._detected_at(r) if host.preempted else None
                    if seen is not None and seen > time.monotonic():
                        hidden = seen if hidden is None else min(hidden, seen)
                    else:
                        ended.append(r)
                if ended:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left if hidden is None else max(0.0, min(left, hidden - time.monotonic())))
            for r in ended:
                self._hosts[r].reported = True
        return [self._hygiene(self._outcome(r)) for r in ended]

    def _hygiene(self, o: HostOutcome) -> HostOutcome:
        """A TPU host that failed with a known device fault's signature (fray_core.signatures: device busy, a
        stale libtpu lockfile, libtpu crashing at start) failed for its host, not for the job: PREEMPTED,
        counted towards the host's quarantine, its lockfile removed, the fault named in the cause."""
        run = o.run
        if o.kind is not HostOutcomeKind.FAILED or run.lease.handle is None:
            return o
        host = self._hosts[run]
        if host.log_error is not None or host.start_error is not None or host.unresponsive is not None:
            return o
        rc = host.returncode
        fault = device_fault(f"{o.error or ''}\n" + "\n".join(host.tail), -rc if rc is not None and rc < 0 else None)
        if fault is None:
            return o
        self.fleet.device_fault(run.lease, run.host_index, fault)
        where = f"{run.lease.name} host {run.host_index}"
        return HostOutcome(
            run, HostOutcomeKind.PREEMPTED, error=f"DeviceFault: {fault} on {where} (lockfile removed)\n{o.error or ''}"
        )

    def _outcome(self, run: HostRun) -> HostOutcome:
        host = self._hosts[run]
        rc = host.returncode
        where = f"{run.lease.name} host {run.host_index}"
        if host.log_error is not None:
            return HostOutcome(run, HostOutcomeKind.FAILED, error=host.log_error)
        if host.start_error is not None:  # bad cwd, bad env: the same on every try, so not a preemption
            return HostOutcome(run, HostOutcomeKind.FAILED, error=host.start_error)
        if host.preempted:
            return HostOutcome(run, HostOutcomeKind.PREEMPTED, error=f"Preempted: slice {run.lease.name} was preempted")
        if host.cancelled:
            return HostOutcome(run, HostOutcomeKind.CANCELLED)
        payload = _read_result(host.result_path)
        if host.unresponsive is not None:
            # The supervisor killed the host itself: whatever the worker wrote, no guardian saw it end or
            # cleaned up after it. Not a preemption (no slice went away): FAILED, saying so first.
            if payload is None:
                reported = ""
            elif payload[0] == "error":
                reported = f"\n(its worker had failed before: {payload[2]})"
            else:
                reported = "\n(its worker had returned before; a result no guardian saw the host end with is not used)"
            error = f"GuardianUnresponsive: host on {where}: {host.unresponsive}{reported}"
            return HostOutcome(run, HostOutcomeKind.FAILED, error=error)
        if payload is not None and payload[0] == "ok":
            return HostOutcome(run, HostOutcomeKind.SUCCEEDED, result=payload[1])
        if payload is not None and payload[0] == "exit":
            if payload[1] == 0:
                return HostOutcome(run, HostOutcomeKind.SUCCEEDED, result=None)
            tail = "\n".join(host.tail)
            end = exit_code_text(payload[1]) + oom_suffix(payload[1], self._oom.get(run))
            return HostOutcome(
                run, HostOutcomeKind.FAILED, error=f"CommandFailed: {end} on {where}; last output:\n{tail}"
            )
        if payload is not None and payload[0] == "error":
            kind = HostOutcomeKind.PREEMPTED if payload[1] == "infra" else HostOutcomeKind.FAILED
            return HostOutcome(run, kind, error=payload[2])
        tail = "\n".join(host.tail)
        return HostOutcome(
            run,
            HostOutcomeKind.FAILED,
            error=f"HostCrashed: host process on {where} {describe_exit(rc)}{oom_suffix(rc, self._oom.get(run))}; "
            f"last output:\n{tail}",
        )

    # -------------------------------------------------------------------------------------- cancel

    def _detected_at(self, run: HostRun) -> float | None:
        """When the fleet's control plane detects the loss of a preempted host's slice (its detection_delay)."""
        if run.lease.handle is None:
            return None
        return self.fleet.detected_at(run.lease)

    def lease_health(self, leases: Sequence[SliceLease]) -> list[LeaseHealth]:
        """The fleet model's view of each TPU slice: lost (once detected), draining (a notice, with its
        deadline) or intact; a CPU/GPU gang is intact."""
        out = []
        for lease in leases:
            state, deadline = self.fleet.lease_state(lease) if lease.handle is not None else ("intact", None)
            if state == "lost":
                out.append(LeaseHealth.lost("preempted"))
            elif state == "draining" and deadline is not None:
                out.append(LeaseHealth.draining(deadline, "preemption notice"))
            else:
                out.append(LeaseHealth.intact())
        return out

    @property
    def detection_delay(self) -> float:
        return self.fleet.model.detection_delay

    def heartbeats(self, runs: Sequence[HostRun]) -> dict[HostRun, Heartbeat]:
        """The heartbeat file of each running host (``fray_core.heartbeat`` writes it)."""
        now = time.time()
        out = {}
        for r in runs:
            beat = read_heartbeat(os.path.join(self.job_dir, f"heartbeat-{self._files[r][0]}"))
            if beat is not None:
                out[r] = Heartbeat(age=max(0.0, now - beat[0]), step=beat[1])
        return out

    def dump_stacks(self, runs: Sequence[HostRun]) -> None:
        """Each host's worker writes the stacks of all its threads (faulthandler) to its output, hence to the
        job log under the host's prefix. Waits (at most 2 s) until every dump has begun to reach the log and
        the host's output went quiet: a SIGTERM arriving mid-dump would cut it short."""
        hosts = [self._hosts[r] for r in runs if not self._hosts[r].done.is_set()]
        for host in hosts:
            self.log.write(host.tag, "[fray] the Python stacks of every thread of this host, before it is stopped:")
            host.signal(STACKS)
        deadline = time.monotonic() + 2.0
        for host in hosts:
            last = None
            while time.monotonic() < deadline and not host.done.is_set():
                tail = list(host.tail)
                if any("most recent call first" in line for line in tail) and tail[-1] is last:
                    break  # the dump began and nothing came for one more poll: it is written
                last = tail[-1] if tail else None
                host.done.wait(0.1)

    def announce_preemption(self, runs: Sequence[HostRun], deadline: float) -> None:
        """Write the deadline where ``fray_core.preemption_notice()`` of these hosts reads it."""
        attempts = {self._files[r][1] for r in runs}
        for attempt in attempts:
            write_notice(os.path.join(self.job_dir, f"notice-a{attempt}"), deadline)
        for r in runs:
            self.log.write(
                self._hosts[r].tag, f"[fray] preemption notice: the slice goes away at {deadline:.3f} (epoch s)"
            )

    def free_slices(self, tpu_type: str) -> int:
        """Free slices of the type this job could take now (not reserved for a job waiting in the
        fleet's queue): how an elastic job knows it could grow."""
        return self.fleet.model.free_slices(tpu_type, self.job_id)

    def cancel(self, runs: list[HostRun], grace: float | None = None) -> None:
        """Stop these hosts: SIGTERM (the guardian passes it to every process of the host), then kill
        whatever is left after ``grace`` seconds (1 s when not given; an elastic job's resize gives its
        ``ElasticConfig.grace`` to checkpoint)."""
        for r in runs:
            host = self._hosts[r]
            if not host.done.is_set():
                host.cancelled = True
                host.signal(signal.SIGTERM)  # the host's guardian passes it to every process of the host
        # Give the processes a moment to exit cleanly, then make sure.
        deadline = time.monotonic() + (1.0 if grace is None else max(0.0, grace))
        for r in runs:
            host = self._hosts[r]
            if not host.done.wait(max(0.0, deadline - time.monotonic())):
                host.kill()

    def close(self) -> None:
        """The job ended (terminated included): kill any host still running, and leave the fleet's queue
        at once, so the jobs behind it do not wait for its entry to expire."""
        self.kill_all()
        self.fleet.model.leave_queue(self.job_id)
        if self.budget is not None:
            self.budget.leave(self.job_id)

    def kill_all(self) -> None:
        for host in list(self._hosts.values()):
            if not host.done.is_set():
                host.cancelled = True
                host.kill()


def _read_result(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return cloudpickle.load(f)
    except (FileNotFoundError, EOFError):
        return None
    except Exception as e:  # the result exists but cannot be loaded here (e.g. a missing module)
        return ("error", "user", f"ResultUnpicklingError: cannot load the host's result: {e!r}\n")


def _write_payload(path: str, entrypoint: Entrypoint) -> None:
    """Write the attempt's pickled entrypoint for its hosts, whole or not at all: a payload cut short by a full
    disk would be found by the attempt's next slice (it exists) and fail its hosts with an unpickling error.
    An ``OSError`` is raised with ``path`` in it (a write or close that fails names no file): the runner tells a
    full disk from a transient error by its errno, and the job's error says where."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            cloudpickle.dump(entrypoint, f)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.remove(tmp)  # give back what the partial write took
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, path) from e
        raise

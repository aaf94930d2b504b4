"""``fray sim``: a multislice job on a simulated TPU fleet with injected faults, attempts shown live.

The local backend adds this command to the ``fray`` CLI (``fray_core.cli`` loads it by name, like a backend).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

from fray_core.cli.common import (
    UsageError,
    add_cluster_option,
    at_least_one,
    check_default_jobs_dir,
    describe_os_error,
    int_in,
    non_negative_float,
    probability,
    tpu_type,
)
from fray_core.cli.live import follow
from fray_core.limits import MAX_FAULTS, MAX_REPLICAS, MAX_RETRIES, MAX_SECONDS, show_number
from fray_local.fleet import FailHost, FaultPlan, PreemptSlice

__all__ = ["add_parser", "cmd_sim", "sim_fault_plan", "sim_train"]


def sim_train(steps: int, step_time: float) -> str:
    """The stand-in training loop of ``fray sim``: prints a line per step, returns a summary."""
    slice_id = os.environ.get("FRAY_SLICE_ID", "0")
    host = os.environ.get("TPU_WORKER_ID", "0")
    coordinator = os.environ.get("MEGASCALE_COORDINATOR_ADDRESS", "-")
    for step in range(steps):
        print(
            f"step {step + 1}/{steps} on {os.environ.get('TPU_NAME')} (slice {slice_id} host {host}, "
            f"coordinator {coordinator})",
            flush=True,
        )
        time.sleep(step_time)
    return f"slice {slice_id} host {host}: {steps} steps"


def sim_fault_plan(
    slices: int, preemptions: int, failures: int, seed: int, chaos: float | None, steps: int = 6, step_time: float = 0.3
) -> tuple[FaultPlan, list[str]]:
    """The fault plan of ``fray sim`` and a description of it, reproducible from ``seed``; a ValueError naming
    the options when the plan would be too large (checked before any fault is made)."""
    if preemptions + failures > MAX_FAULTS:  # an attempt each: FaultPlan's limit, said in the options' words
        raise ValueError(
            f"--preemptions + --failures: at most {MAX_FAULTS:,} faults allowed (an attempt each), got "
            f"{preemptions + failures:,}"
        )
    # the faults' times are fractions of an attempt's steps: past MAX_SECONDS, deadlines no clock holds.
    # Compared without the product: an int of 400 digits times a float raises OverflowError.
    if step_time > 0 and steps > MAX_SECONDS / step_time:
        raise ValueError(
            f"--steps x --step-time: {show_number(steps)} x {step_time:g} s is more than {MAX_SECONDS:g} s per "
            "attempt, the most allowed"
        )
    if chaos is not None:
        # a draw per slice per attempt, within FaultPlan's limit: fewer attempts of chaos for a huge fleet
        attempts = min(50, MAX_FAULTS // max(1, slices))
        plan = FaultPlan.chaos(seed, chaos, attempts=attempts, max_slices=slices, horizon=0.9 * steps * step_time)
        return plan, [f"chaos: each slice preempted with probability {chaos} per attempt (seed {seed})"]
    rng = random.Random(seed)
    faults: list[Any] = []
    desc = []
    for a in range(preemptions):
        # lands while the hosts are still stepping: 50-90% into the steps (host start-up only adds to it)
        s, after = rng.randrange(slices), round(rng.uniform(0.5, 0.9) * steps * step_time, 2)
        faults.append(PreemptSlice(attempt=a, slice_index=s, after=after))
        desc.append(f"attempt {a}: preempt slice {s} after {after}s")
    for i in range(failures):
        a = preemptions + i
        faults.append(FailHost(attempt=a, slice_index=0, host_index=0, message=f"injected failure in attempt {a}"))
        desc.append(f"attempt {a}: fail host 0 of slice 0")
    return FaultPlan(faults, seed=seed), desc or ["no faults"]


def cmd_sim(args: argparse.Namespace) -> int:
    """``fray sim``: a multislice job on a simulated fleet with injected faults, attempts shown live."""
    from fray_core.cluster import parse_spec
    from fray_core.request import Entrypoint, JobRequest, ResourceConfig
    from fray_local.cluster import (
        MAX_HOSTS_SPEC,
        LocalCluster,
        check_max_hosts,
        default_max_hosts,
        max_hosts_of_spec,
    )
    from fray_local.fleet import TpuFleet

    spec = args.cluster or os.environ.get("FRAY_CLUSTER_SPEC") or "local"
    scheme, params = parse_spec(spec)
    if scheme != "local" or "tpu" in params:
        raise UsageError(
            "fray sim makes its own simulated fleet (--tpu/--slices); --cluster may only be "
            "'local', 'local?jobs_dir=DIR' or 'local?max_hosts=N'"
        )
    max_hosts = max_hosts_of_spec(params)
    plan, desc = sim_fault_plan(
        args.slices, args.preemptions, args.failures, args.seed, args.chaos, args.steps, args.step_time
    )
    budget = args.max_retries_preemption
    if budget is None:
        budget = 20 if args.chaos is not None else args.preemptions
    # the request before the fleet and the cluster: one it refuses (10,000 x v4-4096 is too many hosts) is one
    # line, with nothing made to clean up
    request = JobRequest(
        name=f"sim-{args.tpu}x{args.slices}",
        entrypoint=Entrypoint(callable=sim_train, function_args={"steps": args.steps, "step_time": args.step_time}),
        resources=ResourceConfig.with_tpu(args.tpu, slice_count=args.slices),
        max_retries_preemption=budget,
        max_retries_failure=args.failures,
    )
    max_hosts = max_hosts or default_max_hosts()  # computed once: the refusal here and the cluster's bound
    check_max_hosts(request, max_hosts, field=f"--cluster 'local?{MAX_HOSTS_SPEC}=N'")
    check_default_jobs_dir(spec)
    fleet = TpuFleet({args.tpu: args.slices}, fault_plan=plan)
    try:
        cluster = LocalCluster(fleet=fleet, jobs_dir=params.get("jobs_dir") or None, max_hosts=max_hosts)
    except OSError as e:
        fleet.close()
        raise UsageError(
            f"cannot use the jobs dir: {describe_os_error(e)} (check FRAY_JOBS_DIR or --cluster 'local?jobs_dir=DIR')"
        ) from None
    hosts = request.resources.device.hosts  # type: ignore[union-attr]
    print(f"[fray] simulated fleet: {args.slices} x {args.tpu} ({hosts} host processes per slice)")
    for line in desc:
        print(f"[fray] injected: {line}")
    print(f"[fray] budgets: max_retries_preemption={budget}, max_retries_failure={args.failures}")
    try:
        job_id = cluster.launch(request)
        print(f"[fray] launched {job_id}", flush=True)
        return follow(cluster, job_id, sys.stdout, stop_on_interrupt=True, always_table=True)
    finally:
        cluster.close()


def add_parser(sub: Any, fmt: type[argparse.HelpFormatter], epilog: str) -> None:
    """Add ``fray sim`` to the ``fray`` command line (called by ``fray_core.cli``)."""
    p = sub.add_parser(
        "sim",
        help="a multislice demo on a simulated fleet with injected preemptions",
        description="Run a multislice job on a simulated TPU fleet (real host processes) with injected "
        "preemptions and failures, showing every attempt as it ends. Faults are reproducible from --seed.",
        formatter_class=fmt,
        epilog=epilog,
    )
    p.add_argument("--tpu", metavar="TYPE", type=tpu_type, default="v4-16", help="TPU pod type (default v4-16)")
    # counts within the limits of what they build (fray_core.limits), refused as the command line is read
    p.add_argument(
        "--slices",
        metavar="N",
        type=int_in(1, MAX_REPLICAS),
        default=2,
        help="slices of the job and of the fleet (default 2)",
    )
    p.add_argument(
        "--preemptions", metavar="N", type=int_in(0, MAX_FAULTS), default=1, help="attempts to preempt (default 1)"
    )
    p.add_argument(
        "--failures",
        metavar="N",
        type=int_in(0, MAX_FAULTS),
        default=0,
        help="attempts to fail after those (default 0)",
    )
    p.add_argument(
        "--chaos",
        metavar="RATE",
        type=probability,
        help="random preemptions instead: probability per slice per attempt",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the fault plan (default 0)")
    p.add_argument("--steps", metavar="N", type=at_least_one, default=6, help="training steps per attempt (default 6)")
    p.add_argument(
        "--step-time", metavar="SECONDS", type=non_negative_float, default=0.3, help="seconds per step (default 0.3)"
    )
    p.add_argument("--max-retries-preemption", metavar="N", type=int_in(0, MAX_RETRIES), help="default: --preemptions")
    add_cluster_option(p)
    p.set_defaults(func=cmd_sim)

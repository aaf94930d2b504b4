"""The TPU slices of a Ray cluster as its node table and available resources show them: which exist
(:func:`discover_slices`), and for one slice type the view a queue needs (:func:`slice_view`: alive, free,
held by which job, with a host down).

Computed from one :class:`fray_ray.view.ClusterView`: by the cluster's scheduler actor for every queued job
of the cluster (one read of the cluster's state a second for all of them, issue 29), and by a supervisor
once, when its job is admitted and claims its slices.

>>> head = {"Resources": {"TPU": 4.0, "TPU-v4-16-head": 1.0, "s1": 1.0}, "Labels": {}}
>>> sorted(discover_slices({"n0": head}))
['s1']
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import attrs

from fray_core.tpu import get_tpu_spec, normalize_tpu_type

__all__ = [
    "POD_TYPE_LABEL",
    "SLICE_NAME_LABEL",
    "TOPOLOGY_LABEL",
    "WORKER_ID_LABEL",
    "SliceView",
    "TpuSlice",
    "discover_slices",
    "head_group_job",
    "members",
    "slice_view",
]

WORKER_ID_LABEL = "ray.io/tpu-worker-id"
SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"
TOPOLOGY_LABEL = "ray.io/tpu-topology"

_HEAD_GROUP = re.compile(r"^fray-(.+)-head-\d+$")  # a job's slice-head placement group (see _acquire_tpu)
_HEAD_RESOURCE = re.compile(r"^TPU-(.+)-head$")
# Resources Ray itself gives a node: never a slice name (see :func:`discover_slices`).
_RAY_RESOURCES = frozenset({"CPU", "GPU", "TPU", "memory", "object_store_memory"})


@attrs.frozen
class TpuSlice:
    """One TPU slice as the cluster shows it (:func:`discover_slices`): ``hosts`` maps each live node id
    to its worker id (``None``: not known, a label-less host other than worker 0); ``head``: worker 0's node
    id (``""``: not alive); ``topology``: the ``ray.io/tpu-topology`` label (``None``: not labelled);
    ``labelled``: every host carries the ``ray.io/tpu-*`` labels (claimed by label selectors, else by the
    slice-name resource); ``tpu_per_host``: worker 0's ``TPU`` resource (chips x ``RAY_TPU_RESOURCE_PER_CHIP``)."""

    name: str
    pod_type: str
    hosts: dict[str, str | None]
    head: str
    topology: str | None
    labelled: bool
    tpu_per_host: float


def _is_slice_resource(key: str, value: float) -> bool:
    """Could this node resource be a slice name (Ray's ``<TPU_NAME>: 1``)?"""
    return (
        value == 1.0
        and key not in _RAY_RESOURCES
        and not key.startswith(("node:", "accelerator_type:"))
        and "_group_" not in key  # a placement group's bundle
        and not _HEAD_RESOURCE.match(key)
    )


def discover_slices(nodes: dict[str, dict[str, Any]]) -> dict[str, TpuSlice]:
    """The TPU slices of a live node table (``ray.nodes()`` entries by node id), by name.

    A host carrying the ``ray.io/tpu-*`` labels says it all. Without them (KubeRay without its webhook,
    older Ray) a slice is found from the resources Ray gives every TPU VM: worker 0 has ``TPU-<type>-head``,
    and every host of the slice the slice-name resource ``<TPU_NAME>: 1``; the worker ids of the other hosts
    are then unknown.

    >>> head = {"Resources": {"TPU": 4.0, "TPU-v4-16-head": 1.0, "s1": 1.0, "CPU": 1.0}, "Labels": {}}
    >>> other = {"Resources": {"TPU": 4.0, "s1": 1.0, "CPU": 1.0}, "Labels": {}}
    >>> sorted(discover_slices({"n0": head, "n1": other})["s1"].hosts.items())
    [('n0', '0'), ('n1', None)]
    """
    found: dict[str, dict[str, Any]] = {}
    unlabelled: list[tuple[str, dict[str, float]]] = []
    for nid, n in nodes.items():
        labels = n.get("Labels") or {}
        res = n.get("Resources") or {}
        name = labels.get(SLICE_NAME_LABEL)
        if name and labels.get(POD_TYPE_LABEL):
            s = found.setdefault(
                name, {"hosts": {}, "head": "", "labelled": True, "tpu": 0.0, "pod": "", "topology": None}
            )
            wid = labels.get(WORKER_ID_LABEL)
            s["hosts"][nid] = wid
            s["pod"] = s["pod"] or normalize_tpu_type(labels[POD_TYPE_LABEL])
            s["topology"] = s["topology"] or labels.get(TOPOLOGY_LABEL)
            if wid == "0":
                s["head"], s["tpu"] = nid, float(res.get("TPU", 0.0))
        elif res.get("TPU"):
            unlabelled.append((nid, res))
    if unlabelled:
        # Worker 0s first: their head resource names the pod type, and the slice name is a resource of
        # theirs that no other worker 0 has (a slice has one), shared with the slice's other hosts (the one
        # most TPU hosts carry, should a node have more such resources).
        counts: dict[str, int] = {}
        on_heads: dict[str, int] = {}
        for _, res in unlabelled:
            head = any(_HEAD_RESOURCE.match(k) for k in res)
            for key, value in res.items():
                if _is_slice_resource(key, value):
                    counts[key] = counts.get(key, 0) + 1
                    on_heads[key] = on_heads.get(key, 0) + head
        for nid, res in unlabelled:
            heads = [m.group(1) for key in res if (m := _HEAD_RESOURCE.match(key))]
            names = sorted(
                (k for k, v in res.items() if _is_slice_resource(k, v) and k not in found and on_heads[k] == 1),
                key=lambda k: (-counts[k], k),
            )
            if heads and names:
                found[names[0]] = {
                    "hosts": {nid: "0"},
                    "head": nid,
                    "labelled": False,
                    "tpu": float(res["TPU"]),
                    "pod": normalize_tpu_type(heads[0]),
                    "topology": None,
                }
        for nid, res in unlabelled:
            if any(nid in s["hosts"] for s in found.values()):
                continue
            for key in sorted(res):
                s = found.get(key)
                if s is not None and not s["labelled"] and res[key] == 1.0:
                    s["hosts"][nid] = None
                    break
    return {
        name: TpuSlice(name, s["pod"], s["hosts"], s["head"], s["topology"], s["labelled"], s["tpu"])
        for name, s in found.items()
        if s["pod"]
    }


@attrs.frozen
class SliceView:
    """The slices of one type in the cluster, from Ray's own state: ``alive`` (every host alive), ``free``
    (head not held), ``holders`` (slice -> the job holding it), ``incomplete`` (worker 0 alive, another host
    not), and the live node table they were read from (``_claim`` maps nodes to slices with it)."""

    alive: list[str]
    free: list[str]
    holders: dict[str, str]
    incomplete: list[str]
    nodes: dict[str, dict[str, Any]]
    slices: dict[str, TpuSlice] = attrs.field(factory=dict)  # the alive ones, by name
    mismatched: list[str] = attrs.field(factory=list)  # slices of the type with another topology (label)
    token: tuple[int, int] = (0, 0)  # which reads of the shared cluster view it was made from


# the node table last scanned (kept, so its identity cannot be reused), its read number and its slices
_discovery: tuple[Any, int, dict[str, TpuSlice]] = (None, -1, {})


def _discovered(read: int, nodes: dict[str, dict[str, Any]]) -> dict[str, TpuSlice]:
    """``discover_slices(nodes)``, once per read of a node table (``read``: its number; the table itself
    too, as two views' reads may share a number): at 16,000 nodes the scan is tens of ms of CPU, and every
    caller of the process would do it every round."""
    global _discovery
    done = _discovery
    if done[0] is not nodes or done[1] != read:
        done = _discovery = (nodes, read, discover_slices(nodes))
    return done[2]


def members(view: SliceView) -> dict[str, list[str]]:
    """Each alive slice's node ids (what quarantine is keyed by: a reused slice name is new hardware)."""
    return {name: sorted(s.hosts) for name, s in view.slices.items()}


def slice_view(
    nodes: tuple[dict[str, dict[str, Any]], int],
    available: tuple[dict[str, dict[str, float]], int],
    tpu_type: str,
    label: dict[str, str],
    topology: str | None = None,
    group_job: Callable[[str], str] | None = None,
) -> SliceView:
    """The slices of ``tpu_type`` (with ``label``; ``topology``: default the type's) in the cluster, from a
    numbered read of the live node table and one of the available resources (``ClusterView.numbered``);
    ``group_job``: the job holding a slice-head placement group, by group id (see :func:`head_group_job`;
    ``None``: holders not wanted).

    >>> head = {"Resources": {"TPU": 4.0, "TPU-v4-8-head": 1.0, "s1": 1.0}, "Labels": {}}
    >>> v = slice_view(({"n0": head}, 1), ({"n0": {"TPU-v4-8-head": 1.0}}, 1), "v4-8", {})
    >>> v.alive, v.free
    (['s1'], ['s1'])
    """
    spec = get_tpu_spec(tpu_type)
    topology = topology or spec.topology
    table, nodes_read = nodes
    avail, avail_read = available
    every_host = {str(h) for h in range(spec.hosts)}
    heads = {}
    incomplete = []
    slices: dict[str, TpuSlice] = {}
    mismatched = []
    for name, s in _discovered(nodes_read, table).items():
        if s.pod_type != spec.name:
            continue
        if s.topology is not None and s.topology != topology:
            mismatched.append(name)  # same type, another shape: its hosts would get a wrong TPU_TOPOLOGY
            continue
        head_ok = bool(s.head) and label.items() <= (table[s.head].get("Labels") or {}).items()
        # a slice with a host down is no capacity: its host group could never be placed, and a job that
        # kept claiming its head would wait on it forever
        whole = set(s.hosts.values()) >= every_host if s.labelled else len(s.hosts) >= spec.hosts
        if not whole:
            if not label or head_ok:
                incomplete.append(name)
            continue
        if head_ok:
            heads[s.head] = name
            slices[name] = s
    incomplete.sort()
    free = [name for nid, name in heads.items() if avail.get(nid, {}).get(spec.head_resource, 0) >= 1]
    held: dict[str, str] = {}
    if group_job is not None:
        # A placement group's bundle shows on its node as "<resource>_group_[<bundle>_]<group id>"
        # (Ray's naming); the group's name says which job holds the head. Read this way, not from the
        # whole placement-group table: Ray keeps every group ever removed in it (thousands on a busy
        # cluster: ~34 ms of CPU per read at 1,500, bench/NOTES.md), and this runs every acquire round.
        prefix = spec.head_resource + "_group_"
        for nid, name in heads.items():
            for key in avail.get(nid, {}):
                if key.startswith(prefix):
                    job = group_job(key.rsplit("_", 1)[-1])
                    if job:
                        held[name] = job
                        break
    token = (nodes_read, avail_read)
    return SliceView(sorted(heads.values()), sorted(free), held, incomplete, table, slices, sorted(mismatched), token)


def head_group_job(name: str) -> str:
    """The job (its id) whose slice-head placement group has this name, or ``""`` when it is no such group.

    >>> head_group_job("fray-train-20261123-094501-3fa2c1-head-0")
    'train-20261123-094501-3fa2c1'
    """
    m = _HEAD_GROUP.match(name or "")
    return m.group(1) if m else ""

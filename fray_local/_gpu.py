"""GPUs on the local backend: each replica gets its own devices of this machine (``CUDA_VISIBLE_DEVICES``).

The machine's devices are, in this order: ``CUDA_VISIBLE_DEVICES`` of the launching process when it is set
(also the way to declare devices yourself), else what ``nvidia-smi`` lists, else none. A request for more
devices than that fails at ``launch``, as does a named type (``"H100"``) none of the listed devices is.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from fray_core.request import GpuConfig

__all__ = ["assign", "machine_gpus"]


def machine_gpus() -> tuple[list[str], list[str] | None, str]:
    """The device ids of this machine, their names when known, and where both came from."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = [d.strip() for d in cvd.split(",") if d.strip()]
        # CUDA stops at the first invalid entry; "-1" is the usual way to hide every device
        first_bad = next((i for i, d in enumerate(ids) if d.startswith("-")), len(ids))
        return ids[:first_bad], None, f"CUDA_VISIBLE_DEVICES={cvd!r}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], None, "no CUDA_VISIBLE_DEVICES set and no nvidia-smi on PATH"
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], None, f"nvidia-smi failed: {e}"
    if out.returncode != 0:
        return [], None, f"nvidia-smi failed: {out.stderr.strip() or out.returncode}"
    ids, names = [], []
    for line in out.stdout.splitlines():
        if "," in line:
            idx, name = line.split(",", 1)
            ids.append(idx.strip())
            names.append(name.strip())
    return ids, names, "nvidia-smi"


def assign(gpu: GpuConfig, replicas: int) -> list[list[str]]:
    """``gpu.count`` distinct devices for each of ``replicas`` replicas, or a ValueError saying why not.

    >>> os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    >>> assign(GpuConfig("auto", 2), 2)
    [['0', '1'], ['2', '3']]
    >>> del os.environ["CUDA_VISIBLE_DEVICES"]
    """
    ids, names, source = machine_gpus()
    need = gpu.count * replicas
    what = f"{replicas} replica(s) x {gpu.count} GPU(s) of type {gpu.type!r}"
    if gpu.type != "auto" and names is not None:
        ids = [i for i, n in zip(ids, names) if gpu.type.lower() in n.lower()]
        source += f" (devices whose name contains {gpu.type!r}; this machine has {sorted(set(names))})"
    if len(ids) < need:
        raise ValueError(
            f"ResourceConfig.device: {what} need {need} GPU(s); this machine has {len(ids)} ({source}). The "
            "local backend gives each replica its own devices of this machine through CUDA_VISIBLE_DEVICES; "
            "to run GPU code on CPUs, request CpuConfig() or set CUDA_VISIBLE_DEVICES yourself"
        )
    return [ids[r * gpu.count : (r + 1) * gpu.count] for r in range(replicas)]

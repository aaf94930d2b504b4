"""The process of one host (or replica): ``python -m fray_local._host PAYLOAD RESULT``.

It runs the job's entrypoint and writes ``("ok", value)`` / ``("error", kind, text)`` to RESULT with
cloudpickle. Its stdout/stderr are the host's log. Simulated-TPU hooks come through env vars:
``FRAY_SIM_LOCKFILE`` (the host's ``libtpu_lockfile``: present at start means the device is busy),
``FRAY_SIM_FAIL`` (fail this host with that message), ``FRAY_SIM_CRASH`` (die hard, leaving the
lockfile behind, as a crashed TPU process does) and ``FRAY_SIM_DEVICE_ERROR`` (a broken device). A
watchdog ends the host when its supervisor dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any


class TpuDeviceError(RuntimeError):
    """The TPU device cannot be opened (a broken host, ``TpuFleet.break_host``): not the user's fault."""


class DeviceBusyError(TpuDeviceError):
    """The TPU device is held by a stale process (``/tmp/libtpu_lockfile``): retryable, not the user's fault."""


class SimulatedHostFailure(RuntimeError):
    """A failure injected by a fault plan (``FailHost``)."""


def _watchdog(parent: int) -> None:
    # A host must not outlive its supervisor: an orphaned TPU process holds the device forever.
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            try:
                os.killpg(os.getpgid(0), signal.SIGKILL)
            finally:
                os._exit(137)


def _write(path: str, payload: Any) -> None:
    import cloudpickle

    tmp = path + ".tmp"
    try:
        data = cloudpickle.dumps(payload)
    except Exception as e:  # an unpicklable return value is the user's failure, said plainly
        data = cloudpickle.dumps(
            ("error", "user", f"TypeError: the return value of the entrypoint cannot be pickled: {e}\n")
        )
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    payload_path, result_path = argv[1], argv[2]
    threading.Thread(target=_watchdog, args=(os.getppid(),), daemon=True).start()
    extra_path = os.environ.pop("FRAY_SYS_PATH", None)
    if extra_path:
        for p in reversed(json.loads(extra_path)):
            if p not in sys.path:
                sys.path.insert(0, p)

    lockfile = os.environ.pop("FRAY_SIM_LOCKFILE", None)
    fail_msg = os.environ.pop("FRAY_SIM_FAIL", None)
    crash = os.environ.pop("FRAY_SIM_CRASH", None)
    device_error = os.environ.pop("FRAY_SIM_DEVICE_ERROR", None)
    try:
        if device_error:
            raise TpuDeviceError(device_error.partition(": ")[2] or device_error)
        if lockfile:
            if os.path.exists(lockfile):
                raise DeviceBusyError(
                    f"TPU in use: {lockfile} exists (a crashed process left it; device init failed)"
                )
            with open(lockfile, "w") as f:
                f.write(str(os.getpid()))
        if crash:
            print(f"simulated crash: {crash}", file=sys.stderr, flush=True)
            os._exit(139)  # leaves the lockfile behind, as a crashed libtpu process does
        if fail_msg:
            raise SimulatedHostFailure(fail_msg)

        import cloudpickle

        with open(payload_path, "rb") as f:
            entry = cloudpickle.load(f)
        if entry.callable is not None:
            value = entry.callable(*entry.positional, **entry.function_args)
            _write(result_path, ("ok", value))
            rc = 0
        else:
            rc = subprocess.call(entry.command)
            _write(result_path, ("exit", rc))
    except TpuDeviceError as e:
        _write(result_path, ("error", "infra", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return 3
    except BaseException as e:  # the user's failure, with its traceback
        text = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        sys.stderr.write(text)
        _write(result_path, ("error", "user", text))
        rc = 1
    if lockfile:
        try:
            os.remove(lockfile)
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The local backend's detached supervisor: ``python -m fray_local._detached SPEC``.

:meth:`LocalCluster.launch_detached` starts it in its own session and writes the cloudpickled
:class:`JobRequest` to its stdin. It launches the job on ``SPEC``'s cluster, reports on stdout (JSON lines:
``{"warning": ...}``, then ``{"job_id": ...}`` or ``{"error": ...}``), then supervises the job until it ends:
it is the record's owner pid, honours stop files, stops the job on SIGTERM, SIGINT, SIGHUP and SIGQUIT (the
job ends STOPPED) and ignores SIGUSR1 and SIGUSR2 (docs/troubleshooting.md). From the moment it
has the job id, its own output goes to the job's ``supervisor.log``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence

#: env var through which the launcher passes its cwd and sys.path (so the job's callable can be unpickled)
SYS_PATH_ENV = "FRAY_DETACHED_SYS_PATH"
#: signals that stop the job (it ends STOPPED): each is a request to end, from a user or the system
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
#: signals with no meaning for a supervisor, ignored: by default they would kill it and the job would end
#: FAILED ("the process that supervised this job died")
IGNORED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def main(argv: Sequence[str]) -> int:
    import cloudpickle

    from fray_core.cluster import cluster_from_spec
    from fray_core.errors import WaitTimeoutError

    for p in reversed(json.loads(os.environ.pop(SYS_PATH_ENV, "[]"))):
        if p not in sys.path:
            sys.path.insert(0, p)
    channel = os.fdopen(os.dup(1), "w")
    # Before the launch: a signal that comes while the job starts stops it once it has started.
    stop = threading.Event()
    for sig in STOP_SIGNALS:  # `kill PID` of the supervisor stops the job cleanly: it ends STOPPED
        signal.signal(sig, lambda *_: stop.set())
    for sig in IGNORED_SIGNALS:  # their default action would kill the supervisor and orphan the job
        signal.signal(sig, signal.SIG_IGN)

    def send(**msg: str) -> None:
        channel.write(json.dumps(msg) + "\n")
        channel.flush()

    try:
        request = cloudpickle.loads(sys.stdin.buffer.read())
        cluster = cluster_from_spec(argv[0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            job_id = cluster.launch(request)
    except Exception as e:
        send(error=f"{type(e).__name__}: {e}" if not isinstance(e, (ValueError, TypeError)) else str(e))
        return 2
    for w in caught:
        send(warning=str(w.message))
    # From here on our output goes to the job's supervisor.log (a crash of the supervisor lands there).
    store = getattr(cluster, "store", None)
    log_path = store._p(job_id, "supervisor.log") if store is not None and store.is_local else os.devnull
    mode = store.file_mode if store is not None else 0o600  # private like the job's other files
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, mode)
    except OSError:  # a full disk or no descriptors: the job still runs; its record says how it ends
        fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    send(job_id=job_id)
    channel.close()

    try:
        while True:
            if stop.is_set():
                cluster.terminate(job_id)
            try:
                cluster.wait(job_id, timeout=0.5)
                break
            except WaitTimeoutError:
                continue
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

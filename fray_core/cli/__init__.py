"""The ``fray`` command line: launch jobs, watch them, stop them, and run a simulated multislice demo.

::

    fray launch --tpu v4-16 --slices 2 train:main steps=100   # prints the job id, returns at once
    fray launch --wait train.py --lr 3e-4                      # streams logs, exits with the job's code
    fray list
    fray status ID [--json]
    fray logs ID [-f] [--tail N] [--host S/H] [--attempt N]
    fray stop ID... | --all [--status S] [--name GLOB] [-y]
    fray rm ID... ; fray prune --older-than 7d
    fray doctor ; fray completion bash ; fray dashboard [--port 8290]
    fray sim --tpu v4-16 --slices 2 --preemptions 1

Every command takes ``--cluster SPEC`` or ``--address ADDR`` (Ray); without them ``$FRAY_CLUSTER_SPEC``,
``$RAY_ADDRESS``, the config file's ``cluster``, else ``local`` (``config.resolve_spec``; docs/configuration.md);
job records live under ``$FRAY_JOBS_DIR``.

The CLI knows no backend: it gets a cluster from its spec through the backend registry and uses the
``Cluster`` contract only. ``fray launch`` calls ``Cluster.launch_detached`` so the job outlives the command
(the local backend hands it to a detached supervisor process; on Ray the supervisor is a detached actor).
Backends may add commands by name (``fray sim`` is ``fray_local.sim``).

Modules: ``app`` (parser, ``main``), ``common`` (exit codes, errors, argument types, the cluster of a
command), ``config`` (flags, environment, config file), ``launch`` (``fray launch``), ``jobs``
(``list``/``status``/``logs``/``stop``/``rm``/``prune``), ``tools`` (``completion``, ``doctor``,
``dashboard``), ``live`` (following a job: live status line on a terminal, plain lines when piped),
``output`` (tables, timeline, JSON fields, escaping). ``rich`` is imported only when something is drawn.
"""

from __future__ import annotations

from fray_core.cli.app import build_parser, main, register_command
from fray_core.cli.common import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, UsageError
from fray_core.cli.launch import build_request
from fray_core.cli.launch import parse_call_args as _parse_call_args
from fray_core.cli.output import format_table

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_STOPPED",
    "EXIT_USAGE",
    "UsageError",
    "_parse_call_args",  # re-exported for tests/test_cli.py
    "build_parser",
    "build_request",
    "format_table",
    "main",
    "register_command",
]

"""The ``fray`` parser and entry point: one sub-command module per command group, plus commands that
backends add by name (``fray sim`` comes from ``fray_local.sim``)."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from fray_core.cli import jobs, launch, tools
from fray_core.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    UsageError,
    add_cluster_option,
    describe_os_error,
)

__all__ = ["EPILOG", "build_parser", "main", "register_command", "run"]

EPILOG = """\
exit codes:
  0  success; for `launch --wait`, `logs -f` and `sim`: the job SUCCEEDED
  1  the job ended FAILED
  2  bad usage or input (invalid request, unknown job id, unknown cluster)
  3  the job ended STOPPED
  4  timed out or internal error (a supervisor or the cluster did not answer)
  130  interrupted (Ctrl-C); a launched job keeps running

cluster: --cluster SPEC, --address ADDR (Ray), $FRAY_CLUSTER_SPEC, $RAY_ADDRESS,
  the config file's `cluster` ($XDG_CONFIG_HOME/fray/config.toml), else `local`.
  Specs: local, local?tpu=v4-16:2, local?jobs_dir=DIR, ray,
  ray?address=HOST:PORT&namespace=NS&jobs_dir=DIR. Records: $FRAY_JOBS_DIR.
  Every setting and environment variable: docs/configuration.md.
  `fray doctor` checks them.
local backend: `fray launch` starts a detached supervisor process that runs the
  job until it ends.
set FRAY_DEBUG=1 to see tracebacks of errors.
"""

#: commands that a backend package adds: name -> "module:function", where ``function(sub, formatter, epilog)``
#: adds its sub-parser (``set_defaults(func=...)``). Loaded by name, like the backends, so this package
#: never imports a backend.
_COMMANDS: dict[str, str] = {"sim": "fray_local.sim:add_parser"}


def register_command(name: str, target: str) -> None:
    """Add a ``fray NAME`` command: ``target`` is ``"module:function"``, called as ``function(sub, formatter,
    epilog)`` with the argparse sub-parsers action to add its parser to.

    >>> register_command("sim", "fray_local.sim:add_parser")  # doctest: +SKIP
    """
    _COMMANDS[name] = target


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``fray list: error: argument --limit: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs keep their lines (examples, the exit-code table), but a line wider than the
    terminal wraps at words, under its own indent: a terminal would cut it mid-word."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        out = []
        for line in text.splitlines():
            if len(indent + line) <= width:
                out.append(indent + line)
                continue
            lead = indent + line[: len(line) - len(line.lstrip())]
            # a continuation sits under the text of its line: "  4  timed out ..." continues under "timed"
            item = re.match(r"\s*(\S{1,3}\s{2,})", line)
            hang = lead + " " * (len(item.group(1)) if item else (2 if line[:1].isspace() else 0))
            out.append(textwrap.fill(line.strip(), width, initial_indent=lead, subsequent_indent=hang))
        return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``fray`` (also used to render ``fray --help``)."""
    fmt = _Formatter
    parser = _Parser(
        prog="fray",
        description="Launch and watch ML jobs (CPU, GPU, multi-host TPU slices) on the local backend, a "
        "simulated TPU fleet, or Ray.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    add_cluster_option(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    launch.add_parser(sub, fmt, EPILOG)
    jobs.add_parsers(sub, fmt, EPILOG)
    tools.add_parsers(sub, fmt, EPILOG)
    for target in _COMMANDS.values():
        mod, _, attr = target.partition(":")
        getattr(importlib.import_module(mod), attr)(sub, fmt, EPILOG)
    parser.set_defaults(_subparsers=sub.choices, _parser=parser)
    return parser


def _version() -> str:
    """The installed distribution's version (``fray-jobs``), else the checkout's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fray-jobs")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _fail(command: str, e: BaseException) -> int:
    from fray_core.cli.output import safe

    text = str(e) if not isinstance(e, KeyError) or e.args == () else str(e.args[0])
    text = " ".join(text.split("\n")[:1]) if isinstance(e, UsageError) else text.strip().replace("\n", " | ")
    # an error can quote a job's own bytes (a record, a name, an exception message): never raw to a terminal
    print(f"fray {command}: error: {safe(text)}", file=sys.stderr)
    return EXIT_USAGE


def _debug_fail(command: str, e: BaseException) -> int:
    """``FRAY_DEBUG=1``: the traceback, then the same one-line error and exit code as without it."""
    import traceback

    traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    return _fail(command, e)


def _show_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    from fray_core.cli.output import safe

    print(f"fray: warning: {safe(str(message))}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fray`` console script. Returns the exit code (see ``fray --help``).

    >>> main(["list"])  # doctest: +SKIP
    0
    """
    from fray_core.errors import FrayError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # blame the command they belong to (`fray list: error: unrecognized arguments: --jsn`)
            owner = getattr(args, "_subparsers", {}).get(args.command, parser)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # argparse: usage errors exit 2, --help exits 0
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return int(args.func(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `fray status ID | head -1`: the reader has all it wanted
        _drop_stdout()
        return EXIT_OK
    except TimeoutError as e:  # the cluster or a supervisor did not answer in time: not the user's mistake
        (_debug_fail if os.environ.get("FRAY_DEBUG") else _fail)(args.command, e)
        return EXIT_TIMEOUT
    except (UsageError, FrayError, ValueError, TypeError, KeyError) as e:
        return (_debug_fail if os.environ.get("FRAY_DEBUG") else _fail)(args.command, e)
    except OSError as e:  # the machine said no (a full disk, a permission): one line, not a traceback
        if os.environ.get("FRAY_DEBUG"):
            import traceback

            traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
        return _fail(args.command, UsageError(describe_os_error(e)))


def _drop_stdout() -> None:
    """Send what is left of our output to /dev/null, so that exiting does not fail on a closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (an in-process caller's buffer): nothing to drop
        pass
    finally:
        os.close(devnull)


def run() -> NoReturn:
    """``python -m fray_core.cli``: :func:`main`, then exit with its code."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()
    sys.exit(code)

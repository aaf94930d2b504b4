"""marin's ``fray.isolated_env`` (and ``fray.v1.isolated_env``): ``JobGroup``, a group of subprocesses that
are all killed when the group exits, and ``TemporaryVenv``, a throw-away virtual environment to run
commands in (how marin ran tools whose dependencies clash with the job's, such as vLLM).

Same signatures and behaviour as marin's. ``TemporaryVenv`` uses ``uv`` when it is on ``PATH``, as marin
did (``uv venv`` with a managed Python of this version, ``uv pip install``); without ``uv`` it makes the
venv with this Python's ``venv`` module and installs with the venv's ``pip`` (so ``pip_install_args`` must
then be pip's arguments: ``--pre``, not uv's ``--prerelease=allow``).

>>> with JobGroup() as jobs:
...     jobs.run(["true"]).returncode
0
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["JobGroup", "TemporaryVenv"]

logger = logging.getLogger(__name__)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux's PR_SET_PDEATHSIG), so a command of a
    group whose owner was killed does not live on."""
    with contextlib.suppress(Exception):  # best effort, as in marin
        ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _kill_group(process: subprocess.Popen[Any]) -> None:
    # run_async starts each command in its own session: killing the group takes its children too
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        if sys.platform == "win32":
            process.kill()
        else:
            os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)  # reap it: no zombie outlives the group


class JobGroup:
    """Subprocesses started together and killed together: every command started with :meth:`run_async`
    that is still running when the ``with`` block exits is killed with its children (SIGKILL to its process
    group); on Linux a command also dies when this process dies.

    >>> with JobGroup(env={"PATH": os.environ["PATH"], "X": "1"}) as jobs:
    ...     jobs.run(["sh", "-c", "echo $X"], env=None, capture_output=True, text=True).stdout  # doctest: +SKIP
    """

    def __init__(self, *, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        # env: marin keeps it as the group's base environment but passes each call's own env (None: inherit)
        self._base_env = env
        self._cwd = cwd
        self._processes: list[subprocess.Popen[Any]] = []
        self._entered = False

    def _check_entered(self) -> None:
        if not self._entered:
            raise RuntimeError("JobGroup must be entered before calling run methods")

    def __enter__(self) -> JobGroup:
        self._entered = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for process in self._processes:
            if process.poll() is None:
                _kill_group(process)

    def run(
        self, cmd: list[str], *, check: bool = True, env: dict[str, str] | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``cmd`` to completion (``subprocess.run``, ``check=True`` by default) in the group's ``cwd``."""
        self._check_entered()
        if "cwd" not in kwargs and self._cwd:
            kwargs["cwd"] = self._cwd
        logger.info("Running %s", " ".join(cmd))
        return subprocess.run(cmd, env=env, check=check, **kwargs)

    def run_async(self, cmd: list[str], *, env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``cmd`` without waiting (``subprocess.Popen``), in its own session, killed when the group exits."""
        self._check_entered()
        if "cwd" not in kwargs and self._cwd:
            kwargs["cwd"] = self._cwd
        if sys.platform != "win32":
            kwargs.setdefault("start_new_session", True)
            if sys.platform.startswith("linux"):
                kwargs.setdefault("preexec_fn", _die_with_parent)
        logger.info("Running %s", " ".join(cmd))
        process = subprocess.Popen(cmd, env=env, **kwargs)
        self._processes.append(process)
        return process


class TemporaryVenv:
    """A virtual environment in a temporary directory, removed (with every command still running in it)
    when the ``with`` block exits.

    ``workspace`` is copied in (its git-tracked and untracked-but-not-ignored files) and, when it has a
    ``pyproject.toml``, installed with its ``extras`` (``uv sync``; needs ``uv``); ``pip_install_args`` go to
    ``uv pip install`` (or the venv's ``pip install`` without ``uv``); ``venv_args`` to ``uv venv`` (or
    ``python -m venv``). :meth:`run` / :meth:`run_async` run commands with the venv activated
    (:meth:`get_env`).

    >>> with TemporaryVenv() as venv:  # doctest: +SKIP
    ...     venv.run([venv.python_path, "-c", "import sys; print(sys.prefix)"])
    """

    def __init__(
        self,
        *,
        workspace: str | None = None,
        pip_install_args: list[str] | None = None,
        extras: list[str] | None = None,
        venv_args: list[str] | None = None,
        prefix: str = "temp_venv_",
    ) -> None:
        if workspace is not None and not os.path.isdir(workspace):
            raise ValueError(f"TemporaryVenv: workspace={workspace!r} is not a directory")
        self._workspace = workspace
        self._pip_install_args = list(pip_install_args or [])
        self._extras = list(extras or [])
        self._venv_args = list(venv_args or [])
        self._prefix = prefix
        self._temp_dir: tempfile.TemporaryDirectory[str] | None = None
        self._job_group: JobGroup | None = None

    @property
    def workspace_path(self) -> str:
        """The temporary directory (the workspace's copy, when there is one)."""
        if not self._temp_dir:
            raise RuntimeError("TemporaryVenv must be entered before accessing workspace_path")
        return self._temp_dir.name

    @property
    def venv_path(self) -> str:
        """The venv: ``.venv/`` of the workspace copy, else the temporary directory itself."""
        return os.path.join(self.workspace_path, ".venv") if self._workspace else self.workspace_path

    @property
    def python_path(self) -> str:
        """The venv's ``python``."""
        return os.path.join(self.venv_path, "bin", "python")

    @property
    def bin_path(self) -> str:
        """The venv's ``bin`` directory."""
        return os.path.join(self.venv_path, "bin")

    def _copy_workspace(self) -> None:
        src, dest = Path(self._workspace or "."), Path(self.workspace_path)
        try:
            files = subprocess.check_output(
                ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                cwd=src,
                text=True,
                stderr=subprocess.DEVNULL,
                timeout=120,
            ).splitlines()
        except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired):
            shutil.copytree(src, dest, dirs_exist_ok=True)  # not a git checkout: everything
            return
        for rel in files:
            if (src / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, dest / rel)

    def _create(self) -> None:
        uv = shutil.which("uv")
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        if uv:
            cmd = [uv, "venv", f"--python={version}", "--python-preference=only-managed", "--no-project", "--clear"]
            subprocess.check_call([*cmd, *self._venv_args, self.venv_path])
        else:
            with_pip = [] if self._pip_install_args else ["--without-pip"]  # pip only when something is installed
            subprocess.check_call(
                [sys.executable, "-m", "venv", "--clear", *with_pip, *self._venv_args, self.venv_path]
            )
        pyproject = Path(self.workspace_path) / "pyproject.toml"
        if self._workspace and pyproject.exists():
            if not uv:
                raise RuntimeError(
                    f"TemporaryVenv: installing the workspace {self._workspace!r} needs uv (uv sync), not on PATH"
                )
            extras = ["--extra=" + ",".join(self._extras)] if self._extras else []
            subprocess.check_call(
                [uv, "sync", "--python", self.python_path, "--all-packages", *extras],
                cwd=self.workspace_path,
                env=self.get_env(),
            )
        if self._pip_install_args:
            installer = [uv, "pip", "install", "--python", self.python_path] if uv else [self.python_path, "-m", "pip"]
            if not uv:
                installer.append("install")
            subprocess.check_call([*installer, *self._pip_install_args], cwd=self.workspace_path, env=self.get_env())

    def __enter__(self) -> TemporaryVenv:
        if self._temp_dir:
            raise RuntimeError("TemporaryVenv cannot be entered twice")
        self._temp_dir = tempfile.TemporaryDirectory(prefix=self._prefix)
        self._job_group = JobGroup(cwd=self._temp_dir.name).__enter__()
        try:
            if self._workspace:
                self._copy_workspace()
            self._create()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._job_group is not None:
            self._job_group.__exit__(exc_type, exc, tb)
        if self._temp_dir is not None:
            try:
                self._temp_dir.cleanup()
            except OSError as e:
                logger.warning("Failed to clean up %s: %s", self._temp_dir.name, e)

    def get_env(self, base_env: dict[str, str] | None = None) -> dict[str, str]:
        """``base_env`` (default ``os.environ``) with the venv activated, as marin built it: ``VIRTUAL_ENV``,
        its ``bin`` first on ``PATH`` and its ``lib`` first on ``LD_LIBRARY_PATH``, ``TORCH_BACKEND=cpu``,
        ``PYTHONNOUSERSITE=1``; ``PYTHONPATH``, ``TPU_LIBRARY_PATH`` and every ``RAY_*``/``CONDA_*`` removed."""
        if not self._temp_dir:
            raise RuntimeError("TemporaryVenv must be entered before calling get_env()")
        env = dict(os.environ if base_env is None else base_env)
        env["VIRTUAL_ENV"] = self.venv_path
        env["PATH"] = f"{self.bin_path}{os.pathsep}{env.get('PATH', '')}"
        env["TORCH_BACKEND"] = "cpu"
        for var in list(env):
            if var in ("TPU_LIBRARY_PATH", "PYTHONPATH") or var.startswith(("RAY_", "CONDA_")):
                del env[var]
        env["PYTHONNOUSERSITE"] = "1"
        lib = os.path.join(self.venv_path, "lib")
        env["LD_LIBRARY_PATH"] = f"{lib}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else lib
        return env

    def run(
        self, cmd: list[str], *, check: bool = True, env: dict[str, str] | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``cmd`` in the venv and wait (``env`` defaults to :meth:`get_env`)."""
        if self._job_group is None:
            raise RuntimeError("TemporaryVenv must be entered before calling run()")
        return self._job_group.run(cmd, check=check, env=self.get_env() if env is None else env, **kwargs)

    def run_async(self, cmd: list[str], *, env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``cmd`` in the venv without waiting; it is killed when the venv exits."""
        if self._job_group is None:
            raise RuntimeError("TemporaryVenv must be entered before calling run_async()")
        return self._job_group.run_async(cmd, env=self.get_env() if env is None else env, **kwargs)

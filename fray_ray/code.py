"""User code travels: what of the client's code a Ray job ships to the cluster (Ray's ``runtime_env``).

A callable whose module is installed where it runs (site-packages, the standard library, fray itself) needs
nothing. One whose module comes from a directory of the client (a script's folder, a project checked out
next to it, a test directory) is shipped: that directory becomes the job's ``working_dir``, which Ray
uploads from the client once per content (it is cached by hash) and puts first on every host's
``sys.path``. ``EnvironmentConfig(working_dir=...)`` (or ``workspace``) names the directory explicitly. A
directory over :data:`CODE_SIZE_LIMIT` is refused at launch, naming it. No path of the client is ever put
on a host's ``sys.path`` as such: on another machine it does not exist.

Example::

    code_runtime_env(request)     # {"working_dir": "/home/me/proj"} for proj/train.py:main, {} for an installed module
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from fray_ray.connect import connected_gcs_address

__all__ = [
    "CODE_SIZE_LIMIT",
    "UPLOAD_REUSE_S",
    "code_root",
    "code_runtime_env",
    "ray_pin_s",
    "Shipped",
    "scan_code",
    "upload_code",
]

CODE_SIZE_LIMIT = 100 * 1024 * 1024  # bytes of code a job ships (Ray's own package limit is 500 MiB)
_SKIP_DIRS = frozenset(
    {
        ".git",
        "__pycache__",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "node_modules",
        ".hypothesis",
    }
)
_OWN = ("fray_core", "fray_local", "fray_ray", "ray")  # installed on every machine of a Fray-on-Ray cluster


@functools.lru_cache(maxsize=1)
def _installed_prefixes() -> tuple[str, ...]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    return tuple(os.path.realpath(p) for p in paths)


def code_root(module: str) -> str | None:
    """The client directory that holds ``module``'s top-level package or module (what must travel), or
    ``None`` when it is installed (or built in, or fray's own).

    >>> code_root("json") is None
    True
    """
    top = module.split(".")[0]
    if top in _OWN or top == "__main__":
        return None
    mod = sys.modules.get(top)
    path = getattr(mod, "__file__", None)
    if not path:
        locations = getattr(getattr(mod, "__spec__", None), "submodule_search_locations", None)
        path = os.path.join(next(iter(locations)), "__init__.py") if locations else None
    if not path:
        return None
    path = os.path.realpath(path)
    root = os.path.dirname(os.path.dirname(path)) if os.path.basename(path) == "__init__.py" else os.path.dirname(path)
    if any(root == p or root.startswith(p + os.sep) for p in _installed_prefixes()):
        return None
    return root


def _wrapped_modules(fn: Any, entrypoint: Any, depth: int = 3) -> list[str]:
    """The modules of the functions and classes that ``fn`` wraps (a ``functools.partial``'s function and
    arguments, a closure's cells, ``__wrapped__``) and of the entrypoint's arguments, a few levels deep."""
    out: list[str] = []
    seen: set[int] = set()

    def visit(obj: Any, level: int) -> None:
        if level > depth or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            for x in (obj.func, *obj.args, *obj.keywords.values()):
                visit(x, level + 1)
            return
        if isinstance(obj, (list, tuple)):
            for x in obj[:16]:
                visit(x, level + 1)
            return
        if isinstance(obj, dict):
            for x in list(obj.values())[:16]:
                visit(x, level + 1)
            return
        if callable(obj):
            module = getattr(obj, "__module__", None)
            if isinstance(module, str):
                out.append(module)
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    visit(cell.cell_contents, level + 1)
                except ValueError:  # an empty cell
                    pass
            if hasattr(obj, "__wrapped__"):
                visit(obj.__wrapped__, level + 1)

    visit(fn, 0)
    visit(getattr(entrypoint, "function_args", None) or {}, 1)
    return out


def _loaded_code_root() -> str | None:
    """The client directory most of this process's loaded, not installed modules come from (``None``: none)."""
    counts: dict[str, int] = {}
    for name in list(sys.modules):
        if "." in name or name.startswith("_") or name in ("__main__", "__mp_main__"):
            continue
        try:
            root = code_root(name)
        except Exception:  # an odd module object: not ours to ship
            continue
        if root is not None:
            counts[root] = counts.get(root, 0) + 1
    return max(sorted(counts), key=lambda r: counts[r]) if counts else None


_IMPORTABLE = (".py", ".so", ".pyd")  # what a supervisor imports when it loads a job's request


def _scan(root: str, limit: float = float("inf")) -> tuple[int, int, int, str]:
    """``(entries, bytes, newest mtime in ns, code)`` of the files and directories under ``root`` (caches and
    VCS dirs skipped), from ``stat`` alone: what changes when a file is edited, added, removed or renamed (see
    :func:`upload_code`); ``code`` fingerprints the importable files alone (their paths, sizes and mtimes):
    two packages with the same ``code`` differ only in files no import reads (a log, data, outputs), and a
    supervisor process that loaded one can load the other's requests (``fray_ray.cluster``). The walk stops
    once ``bytes`` passes ``limit``."""
    count = total = newest = 0
    code = hashlib.sha1()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for path in (dirpath, *(os.path.join(dirpath, n) for n in sorted(filenames))):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            count, total, newest = count + 1, total + st.st_size, max(newest, st.st_mtime_ns)
            if path.endswith(_IMPORTABLE):
                code.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            if total > limit:
                return count, total, newest, code.hexdigest()
    return count, total, newest, code.hexdigest()


@attrs.frozen(eq=True, hash=False)
class Shipped:
    """A job's code as shipped: its ``runtime_env`` and the fingerprint of its package's importable files
    (``code``, see :func:`_scan`; ``None`` when no folder is shipped). A supervisor process keeps the one it
    was started with, and takes a job whose own one has :meth:`same_code`.

    >>> Shipped({"working_dir": "gcs://_ray_pkg_1.zip"}, "f1").env["working_dir"]
    'gcs://_ray_pkg_1.zip'
    """

    env: dict[str, Any] = attrs.field(factory=dict)
    code: str | None = None

    def same_code(self, job: Shipped) -> bool:
        """Whether a supervisor process started with this can take a job shipped as ``job``: the same env,
        or packages that differ only in files no import reads (a log the script writes beside itself, data,
        outputs), everything else equal. The process then gives the job's hosts the job's own
        ``working_dir`` (a task's runtime_env overrides that field of its parent's), so they see the job's
        files; the supervisor itself only imports the user's modules to load the request. Without this, each
        launch from a folder that changes between launches started a supervisor process of its own (~100 MB;
        bench/NOTES.md, issue 29).

        >>> a = Shipped({"working_dir": "gcs://_ray_pkg_1.zip", "pip": ["x"]}, "f1")
        >>> a.same_code(Shipped({"working_dir": "gcs://_ray_pkg_2.zip", "pip": ["x"]}, "f1"))
        True
        >>> a.same_code(Shipped({"working_dir": "gcs://_ray_pkg_2.zip", "pip": ["x"]}, "f2"))
        False
        """
        if self.env == job.env:
            return True
        if self.code is None or self.code != job.code or "working_dir" not in self.env or "working_dir" not in job.env:
            return False
        return {k: v for k, v in self.env.items() if k != "working_dir"} == {
            k: v for k, v in job.env.items() if k != "working_dir"
        }


def code_runtime_env(request: Any, limit: int = CODE_SIZE_LIMIT) -> dict[str, Any]:
    """The ``runtime_env`` that carries ``request``'s code and environment to the cluster: ``working_dir``
    (``EnvironmentConfig.workspace``, else the directory of the callable's module when it is not installed
    here), ``excludes`` for caches, ``pip``. Raises ``ValueError`` naming the directory when it is over
    ``limit`` bytes."""
    return scan_code(request, limit)[0]


def scan_code(request: Any, limit: int = CODE_SIZE_LIMIT) -> tuple[dict[str, Any], tuple[int, int, int, str] | None]:
    """:func:`code_runtime_env`, and the :func:`_scan` of its ``working_dir`` (``None``: nothing to ship) for
    :func:`upload_code`: one walk of the directory per launch, where there were three (a project of thousands
    of files took tens of ms a launch for them)."""
    env = request.environment
    out: dict[str, Any] = {}
    if env is not None and env.pip_packages:
        out["pip"] = list(env.pip_packages)
    explicit = env.workspace if env is not None else None
    fn = request.entrypoint.callable
    inner = fn
    while isinstance(inner, functools.partial):  # a partial's own __module__ is functools': look inside
        inner = inner.func
    module = getattr(inner, "__module__", None) or ""
    scan: tuple[int, int, int, str] | None = None
    if explicit:
        root, what = os.path.abspath(explicit), "EnvironmentConfig.working_dir"
        if not os.path.isdir(root):  # Ray would fail later, on the cluster, with a traceback
            raise ValueError(f"launch: EnvironmentConfig.working_dir: {explicit!r} is not a directory")
    elif module == "__main__":
        # A script's function travels by value (cloudpickle); the modules it imports from the script's folder do not
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        root = os.path.dirname(os.path.realpath(main)) if main else None
        if root is None or any(root == p or root.startswith(p + os.sep) for p in _installed_prefixes()):
            return out, None
        scan = _scan(root, limit)
        if scan[1] > limit:
            return out, None  # too big to ship whole: the function itself still travels
        what = "the script's folder"
    elif module.split(".")[0] in _OWN:
        # Fray's own entrypoint: a wrapper around the user's function (the levanter compat layer's partial),
        # whose code travels as the user's would; or a held session's worker, whose functions come later from
        # the client's own modules: ship the client directory most of its loaded modules come from
        root = next(filter(None, map(code_root, _wrapped_modules(fn, request.entrypoint))), None)
        root = root or _loaded_code_root()
        if root is None:
            return out, None
        scan = _scan(root, limit)
        if scan[1] > limit:
            return out, None
        what = "the client's code"
    else:
        root, what = code_root(module), f"the code of {module}"
        if root is None:
            return out, None
    if scan is None:
        scan = _scan(root, limit)
    if scan[1] > limit:
        raise ValueError(
            f"launch: {what} is in {root} (over {limit // 2**20} MiB without caches and .git), too much to "
            f"ship to the Ray cluster: "
            "install it on the cluster's machines, or set EnvironmentConfig(working_dir=DIR) to a smaller "
            "directory that holds it"
        )
    out["working_dir"] = root
    out["excludes"] = sorted(f"**/{d}/" for d in _SKIP_DIRS)
    return out, scan


def _ray_upload(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """Ray's own upload of a local ``working_dir`` (hashes its content, pins the package in the GCS)."""
    import logging
    import shutil
    import tempfile

    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    scratch = tempfile.mkdtemp(prefix="fray-code-")
    try:
        quiet = logging.getLogger("fray_ray.code")
        return upload_working_dir_if_needed(
            dict(runtime_env), include_gitignore=True, scratch_dir=scratch, logger=quiet
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def ray_pin_s() -> int:
    """Seconds Ray keeps a fresh upload in the GCS before anything names it: its own setting,
    ``RAY_RUNTIME_ENV_TEMPORARY_REFERENCE_EXPIRATION_S`` (600 by default), read as Ray reads it. Fray's own
    pins of a package (a supervisor's, for a job whose hosts name it) last as long, so one setting governs
    both; at least 1.

    >>> ray_pin_s() >= 1
    True
    """
    try:
        return max(1, int(os.environ.get("RAY_RUNTIME_ENV_TEMPORARY_REFERENCE_EXPIRATION_S", "600")))
    except ValueError:
        return 600


def _reuse_s() -> float:
    """How long an upload's package URI is reused: well within the time Ray pins a fresh upload in the GCS
    (:func:`ray_pin_s`), so a reused URI is never one the GCS may have dropped before the job that names it
    started."""
    return max(0.0, min(UPLOAD_REUSE_S, ray_pin_s() / 4))


UPLOAD_REUSE_S = 60.0  # seconds an uploaded package's URI is reused for the same, unchanged directory
RACY_S = 2.0  # a directory with a file changed less than this long ago is uploaded again at every launch
_uploads: dict[tuple[Any, ...], tuple[dict[str, Any], float]] = {}
_uploads_lock = threading.Lock()


def upload_code(
    runtime_env: dict[str, Any],
    *,
    upload: Callable[[dict[str, Any]], dict[str, Any]] = _ray_upload,
    now: Callable[[], float] = time.monotonic,
    stamp: tuple[int, int, int, str] | None = None,
) -> dict[str, Any]:
    """``runtime_env`` with a local ``working_dir`` uploaded to the connected cluster (its GCS) and replaced
    by the package's URI, as ``ray.init(runtime_env=...)`` does for a driver: Ray takes local directories
    only at that level, and the job's supervisor, which passes the env on, runs on another machine. Content
    already uploaded (same hash) is not sent again.

    Launches in a row from one directory reuse the last upload's URI for up to :data:`UPLOAD_REUSE_S` while
    the directory's files and directories are unchanged by ``stat`` (count, sizes, newest mtime): Ray's
    upload hashes every file's content and pins the package in the GCS, ~15 ms per launch of a small
    directory (bench/NOTES.md, issue 29), the largest part of a launch.

    >>> env = upload_code({"working_dir": "/home/me/proj"})  # doctest: +SKIP
    >>> env["working_dir"]  # doctest: +SKIP
    'gcs://_ray_pkg_5f2a0c1e9b7d3a44.zip'
    """
    if not runtime_env.get("working_dir") or "://" in str(runtime_env["working_dir"]):
        return runtime_env
    root = str(runtime_env["working_dir"])
    if stamp is None:  # ``stamp``: the caller's own scan of it, this launch (scan_code)
        stamp = _scan(root) if os.path.isdir(root) else None
    key = (connected_gcs_address() or "", upload, repr(sorted((k, repr(v)) for k, v in runtime_env.items())), stamp)
    t = now()
    with _uploads_lock:
        hit = _uploads.get(key)
        if hit is not None and t - hit[1] < _reuse_s():
            return dict(hit[0])
    out = upload(runtime_env)
    # A file written in the last seconds may be written again within the file system's timestamp granularity
    # (a few ms) with the same size: its fingerprint would not change, so such an upload is not reused.
    if stamp is None or time.time_ns() - stamp[2] < RACY_S * 1e9:
        return out
    with _uploads_lock:
        if len(_uploads) >= 64:
            _uploads.clear()
        _uploads[key] = (dict(out), t)
    return out

"""Where a ``fray`` command's settings come from: flags, then environment variables, then the config file
(``$XDG_CONFIG_HOME/fray/config.toml``), then the defaults. docs/configuration.md lists every one.

::

    # ~/.config/fray/config.toml
    cluster = "local?tpu=v4-16:2"     # the default cluster spec (like FRAY_CLUSTER_SPEC)
    jobs_dir = "~/fray-jobs"          # where job records live (like FRAY_JOBS_DIR)
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

__all__ = ["CONFIG_ENV", "CONFIG_KEYS", "config_path", "load_config", "resolve_spec"]

#: a config file elsewhere than ``$XDG_CONFIG_HOME/fray/config.toml``
CONFIG_ENV = "FRAY_CONFIG"
#: the keys a config file may set, and what each means
CONFIG_KEYS = {
    "cluster": "the default cluster spec (local, local?tpu=v4-16:2, ray?address=HOST:PORT, ...)",
    "jobs_dir": "where job records, logs and results live (a path or an fsspec URL)",
}


def config_path() -> str:
    """``$FRAY_CONFIG``, else ``$XDG_CONFIG_HOME/fray/config.toml`` (``~/.config/fray/config.toml``).

    >>> import os; os.environ["FRAY_CONFIG"] = "/etc/fray.toml"; config_path()
    '/etc/fray.toml'
    >>> del os.environ["FRAY_CONFIG"]
    """
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return os.path.expanduser(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "fray", "config.toml")


def load_config(path: str | None = None) -> dict[str, str]:
    """The config file's settings (``{}`` when there is none). A file that is not TOML, or a key that is
    unknown or not a string, is a ``ValueError`` naming the file, the key and what is allowed."""
    path = path or config_path()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ValueError(f"config file {path}: cannot be read: {e.strerror or e}") from None
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]
    try:
        table: dict[str, Any] = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"config file {path}: not valid TOML: {e}") from None
    out: dict[str, str] = {}
    for key, value in table.items():
        if key not in CONFIG_KEYS:
            raise ValueError(f"config file {path}: unknown key {key!r}; allowed: {', '.join(CONFIG_KEYS)}")
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"config file {path}: {key}: expected a non-empty string, got {value!r}")
        out[key] = value.strip()
    return out


def address_spec(address: str) -> str:
    """The cluster spec of a Ray address given as ``--address`` or ``$RAY_ADDRESS`` (as ``ray job`` takes it).

    >>> address_spec("10.0.0.2:6379")
    'ray?address=10.0.0.2%3A6379'
    """
    return "ray?" + urllib.parse.urlencode({"address": address.strip()})


def resolve_spec(cluster: str | None, address: str | None) -> tuple[str, str]:
    """The cluster spec of a command and where it came from, first found wins: ``--cluster``, ``--address``,
    ``$FRAY_CLUSTER_SPEC``, ``$RAY_ADDRESS``, the config file's ``cluster``, ``local``. Also applies the
    config file's ``jobs_dir`` when ``$FRAY_JOBS_DIR`` is not set (for this process and what it starts).

    >>> resolve_spec("local?tpu=v4-16:2", None)
    ('local?tpu=v4-16:2', '--cluster')
    """
    if cluster and address:
        raise ValueError(
            "--cluster and --address both name a cluster: give one (--address ADDR means --cluster 'ray?address=ADDR')"
        )
    config = load_config()
    if config.get("jobs_dir") and not os.environ.get("FRAY_JOBS_DIR"):
        os.environ["FRAY_JOBS_DIR"] = os.path.expanduser(config["jobs_dir"])
    if cluster:
        return cluster, "--cluster"
    if address:
        return address_spec(address), "--address"
    env = os.environ.get("FRAY_CLUSTER_SPEC", "").strip()
    if env:
        return env, "FRAY_CLUSTER_SPEC"
    ray = os.environ.get("RAY_ADDRESS", "").strip()
    if ray:
        return address_spec(ray), "RAY_ADDRESS"
    if config.get("cluster"):
        return config["cluster"], f"config file {config_path()}"
    return "local", "default"

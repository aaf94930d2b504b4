"""``python -m fray_core.cli ...``: the ``fray`` command."""

from fray_core.cli.app import run

run()

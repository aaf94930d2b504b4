"""Helpers shared by the test modules (tests/ is on sys.path: pytest's rootdir-relative import mode).

They are the conformance kit's own (``fray_core.testing.conformance``), re-exported under their old import path.
"""

from __future__ import annotations

from fray_core.testing.conformance import check_hosts as check_hosts
from fray_core.testing.conformance import wait_for as wait_for
from fray_core.testing.conformance import write_whole as write_whole

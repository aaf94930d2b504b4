"""Held session calls on the emulated Ray cluster: ``session_calls.py --backend ray`` (see its docstring).

python bench/ray_session_calls.py            # 200 session calls and raw broadcasts, 10 fresh jobs
python bench/ray_session_calls.py --smoke    # 10 / 2 (CI keeps the script working)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import session_calls  # noqa: E402

if __name__ == "__main__":
    session_calls.main([*sys.argv[1:], "--backend", "ray"])

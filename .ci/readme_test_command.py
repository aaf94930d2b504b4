"""Print README.md's test command: the one ```bash block of README.md that runs pytest, as written.

``.ci/run`` runs what this prints, so CI runs exactly what a newcomer copies from README.md. Standard
library only: it runs before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_FENCE = re.compile(r"^```(\w*)\s*$")


def bash_blocks(text: str) -> list[str]:
    """The bodies of the ```bash fenced blocks of a markdown text, in order."""
    blocks, body, lang = [], None, ""
    for line in text.splitlines():
        m = _FENCE.match(line.strip())
        if body is None and m:
            body, lang = [], m.group(1)
        elif body is not None and line.strip() == "```":
            if lang in ("bash", "sh", "shell"):
                blocks.append("\n".join(body))
            body = None
        elif body is not None:
            body.append(line)
    return blocks


def test_command(readme: str) -> str:
    """The command of the only bash block that runs pytest; it must be one line."""
    found = [b.strip() for b in bash_blocks(readme) if re.search(r"\bpytest\b", b)]
    if len(found) != 1:
        raise ValueError(f"README.md: expected one ```bash block that runs pytest, found {len(found)}")
    lines = [line for line in found[0].splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != 1 or lines[0].rstrip().endswith("\\"):
        raise ValueError(f"README.md: the test command must be one line, found: {found[0]!r}")
    return lines[0].strip()


if __name__ == "__main__":
    try:
        print(test_command((Path(__file__).resolve().parent.parent / "README.md").read_text()))
    except ValueError as e:
        sys.exit(str(e))

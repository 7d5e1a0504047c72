"""The command blocks of a Markdown guide, each with what the guide says about running it here.

Every ```bash block must follow an HTML comment: `<!-- runs-here -->` (tests/docs runs it) or
`<!-- not-here: why -->`. A block added without one fails the test, so the guide cannot grow commands that
nothing runs and nothing explains."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_BLOCK = re.compile(
    r"(?:<!--\s*(?P<mark>runs-here|not-here:?)(?P<why>[^>]*?)\s*-->\s*\n)?```bash\n(?P<body>.*?)```", re.S
)


@dataclass(frozen=True)
class Block:
    line: int
    """Where the block starts in the guide (1-based), for messages."""
    body: str
    runs_here: bool | None
    """True: tests/docs runs it; False: the guide says why not; None: unmarked."""
    why_not: str


def command_blocks(guide: Path) -> list[Block]:
    text = guide.read_text()
    blocks = []
    for match in _BLOCK.finditer(text):
        mark = match.group("mark")
        runs_here = None if mark is None else mark == "runs-here"
        line = text.count("\n", 0, match.start("body"))
        blocks.append(Block(line, match.group("body"), runs_here, (match.group("why") or "").strip()))
    return blocks

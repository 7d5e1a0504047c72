"""The worker's stream reader fed from bytes: an answer's SSE body in chunks cut wherever a test likes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from datagen_operator.engine.client.generate import read_incremental_stream


class ChunkedContent:
    """What `read_incremental_stream` uses of aiohttp's StreamReader (`iter_any`), over fixed chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def read_chunks(chunks: list[bytes]) -> tuple[Any, dict[str, Any]]:
    """`read_incremental_stream` over `chunks`, as it reads a server's answer: (ids, meta)."""
    return asyncio.run(read_incremental_stream(cast(Any, ChunkedContent(chunks))))

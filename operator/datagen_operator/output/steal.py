"""Work stealing between shards: which worker generates which chunk of a shard's lines, settled on the output
volume by files only (no server, no lock service).

A shard's own lines (its ShardScan's items in dataset order: valid prompts and lines set aside alike) are cut
into chunks of `chunk_lines` consecutive items; chunk k holds items k*chunk_lines .. (k+1)*chunk_lines-1. A
chunk is generated, whole, by the worker that first claims it:

    claims/<shard:05d>/<chunk:08d>      "<claimant shard> <nonce>\\n", the claimant's name for itself
    claims/chunk-lines                  the chunk size, settled by the first worker (the same protocol)
    claims/<shard:05d>/closed           nobody else takes this shard's chunks (its output began without claims)

A claim is written to a temporary file, fsynced, then hard-linked to its name (`link` fails with EEXIST when
the name exists: atomic on local filesystems and NFS), and the directory fsynced, all before any prompt of the
chunk is sent. So a claim is never seen half written, two claimers cannot both win, and a crash at any instant
leaves either no claim (nothing of the chunk sent) or a whole one (its claimant finishes it on resume, keyed by
its own records as always). The owner claims its chunks ascending as its feeder reaches them; a worker whose own
shard has nothing left claims another shard's unclaimed chunks from the end. Records of a chunk go into its
claimant's shard files.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from datagen_operator.output.layout import OutputLayout, fsync_dir

CHUNK_LINES = 16
"""Items a chunk holds: what a worker commits to ahead of sending, so what the last chunks of a run leave
uneven between workers (about one round of a worker's requests); a claim (two fsyncs) costs little beside 16
requests."""
CONVERSATION_CHUNK_LINES = 4
"""A chunk of whole conversations (generation.turns all): each line is several requests in a row."""


def chunk_of(item_index: int, chunk_lines: int = CHUNK_LINES) -> int:
    """The chunk of a shard's `item_index`-th item (0-based, over its ShardScan's items)."""
    return item_index // chunk_lines


def chunks_for(items: int, chunk_lines: int = CHUNK_LINES) -> int:
    """How many chunks a shard of `items` items has."""
    return -(-items // chunk_lines)


class Claims:
    """The claims of one output (`<output>/claims`)."""

    def __init__(self, output: Path, chunk_lines: int = CHUNK_LINES) -> None:
        self.root = OutputLayout(Path(output)).claims
        self.chunk_lines = chunk_lines
        self.nonce = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        """Told apart from another process claiming under the same shard index (a link whose answer was lost)."""

    def settle(self) -> int:
        """The chunk size of this output: the first worker's (`chunk_lines` as it asked), kept in the claims so
        every later worker numbers the chunks the same whatever it would choose."""
        path = self.root / "chunk-lines"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            _publish(path, f"{self.chunk_lines}\n")
        self.chunk_lines = int(path.read_text())
        return self.chunk_lines

    def shard_dir(self, shard: int) -> Path:
        return self.root / f"{shard:05d}"

    def path(self, shard: int, chunk: int) -> Path:
        return self.shard_dir(shard) / f"{chunk:08d}"

    def owner(self, shard: int, chunk: int) -> int | None:
        """Who claimed chunk `chunk` of `shard`, or None."""
        try:
            text = self.path(shard, chunk).read_text()
        except FileNotFoundError:
            return None
        return int(text.split()[0])

    def claim(self, shard: int, chunk: int, claimant: int) -> int:
        """Claim chunk `chunk` of `shard` for `claimant` unless someone has; the chunk's owner either way. Durable
        when it returns: only then may a prompt of the chunk be sent."""
        existing = self.owner(shard, chunk)
        if existing is not None:
            return existing
        directory = self.shard_dir(shard)
        directory.mkdir(parents=True, exist_ok=True)
        body = f"{claimant} {self.nonce}\n"
        text = _publish(self.path(shard, chunk), body)
        return claimant if text == body else int(text.split()[0])

    def close(self, shard: int) -> None:
        """Keep other workers off `shard`'s chunks for good: its records were made before claims existed, so its
        chunks do not say what it made."""
        self.shard_dir(shard).mkdir(parents=True, exist_ok=True)
        _publish(self.shard_dir(shard) / "closed", "closed\n")

    def closed(self, shard: int) -> bool:
        return (self.shard_dir(shard) / "closed").exists()

    def claimed(self, shard: int) -> set[int]:
        """The chunks of `shard` that someone claimed (a directory listing; nothing is read)."""
        try:
            names = os.listdir(self.shard_dir(shard))
        except FileNotFoundError:
            return set()
        return {int(name) for name in names if name.isdigit()}

    def held(self, claimant: int, shard_count: int) -> dict[int, list[int]]:
        """shard -> chunks of other shards that `claimant` claimed (ascending): what it must finish."""
        held: dict[int, list[int]] = {}
        for shard in range(shard_count):
            if shard == claimant:
                continue
            chunks = sorted(chunk for chunk in self.claimed(shard) if self.owner(shard, chunk) == claimant)
            if chunks:
                held[shard] = chunks
        return held


def _publish(final: Path, body: str) -> str:
    """Make `final` hold `body` unless it exists: written to a temporary file, fsynced, hard-linked to its name
    (EEXIST when someone was first), the directory fsynced. What `final` holds either way."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{id(body):x}.tmp")
    try:
        with tmp.open("w") as file:
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(tmp, final)
        except FileExistsError:
            pass
        except OSError:
            # NFS may answer a retransmitted link with an error after the first one made it: the name says.
            if not final.exists():
                raise
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(final.parent)
    return final.read_text()

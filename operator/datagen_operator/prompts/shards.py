"""Which shard owns a dataset line, and the later of two lines with one id set aside.

Shard assignment hashes the prompt id (blake2b, not Python's salted `hash`), so every restart, pod and machine
agrees, and two lines with the same id always land in the same shard, where the second one is set aside as a
duplicate. A line without a usable id is owned by shard `line % count`, so exactly one shard reports it."""

from __future__ import annotations

from collections.abc import Callable
from hashlib import blake2b

from datagen_operator.prompts.line_shape import BAD_JSON, DUPLICATE_ID, Problem
from datagen_operator.prompts.lines import MalformedLine, PromptRef, excerpt, ref_slot_setters


def shard_of_id(prompt_id: str, shard_count: int) -> int:
    # The big-endian integer of the id's 8-byte blake2b digest (UTF-8), modulo the shard count; spelled with
    # the defaults (UTF-8, big-endian), which cost less to call: every shard calls it once per dataset line.
    return int.from_bytes(blake2b(prompt_id.encode(), digest_size=8).digest()) % shard_count


def shard_of_line(position: int, shard_count: int) -> int:
    return position % shard_count


class _Duplicate:
    """What take_valid returns for a later line with an id this shard already holds."""


DUPLICATE = _Duplicate()


class Assigner:
    """Shard ownership and duplicate detection, line by line, for lines already validated.

    Duplicates are found by the ids' 64-bit hashes (prompts/seen.py, about 10 bytes an id): two distinct ids
    share one with probability ~n^2/2^65 (3e-8 for a million ids)."""

    def __init__(self, shard_index: int, shard_count: int) -> None:
        self.shard_index = shard_index
        self.shard_count = shard_count
        from datagen_operator.prompts.seen import SeenHashes  # numpy: only once a dataset is read

        self.seen = SeenHashes()
        self.integer_ids = SeenHashes()
        """The ids taken that a line held as an integer (few datasets have any), to name a collision of 1 and "1"."""
        self.take_valid = self._valid_taker()

    def _valid_taker(self) -> Callable[[int, str, int, int], PromptRef | _Duplicate | None]:
        """take_valid(position, id, offset, length): a line validate_prompt accepts, as this shard sees it:
        its PromptRef, DUPLICATE (set it aside: `duplicate`), or None (another shard's). A closure over
        locals: it runs once per valid line."""
        shard_index, shard_count = self.shard_index, self.shard_count
        first_time = self.seen.add
        new = object.__new__
        set_position, set_id, set_offset, set_length = ref_slot_setters()

        def take_valid(position: int, prompt_id: str, offset: int, length: int) -> PromptRef | _Duplicate | None:
            # One shard owns every id: the hash would only say 0.
            if shard_count > 1 and shard_of_id(prompt_id, shard_count) != shard_index:
                return None
            if not first_time(hash(prompt_id)):
                return DUPLICATE
            ref = new(PromptRef)  # PromptRef(position, prompt_id, offset, length), see ref_slot_setters
            set_position(ref, position)
            set_id(ref, prompt_id)
            set_offset(ref, offset)
            set_length(ref, length)
            return ref

        return take_valid

    def took_integer(self, prompt_id: str) -> None:
        """The line just taken held its id as an integer."""
        self.integer_ids.add(hash(prompt_id))

    def duplicate(self, position: int, prompt_id: str, raw: bytes | str, integer: bool = False) -> MalformedLine:
        """A later line with an id already taken; `integer`: this line holds it as an integer."""
        if integer != (hash(prompt_id) in self.integer_ids):
            first, this = ("string", "integer") if integer else ("integer", "string")
            reason = (
                f"id {prompt_id!r} collides: an earlier line holds it as the {first} and this one as the {this}, and "
                "ids are stored as strings, so they would be one prompt (first occurrence kept); give one of them "
                "another id"
            )
        else:
            reason = f"duplicate id {prompt_id!r} (first occurrence kept)"
        return MalformedLine(position, reason, excerpt(raw), prompt_id, DUPLICATE_ID)

    def set_aside(
        self, position: int, prompt_id: str | None, problem: Problem, raw: bytes | str
    ) -> MalformedLine | None:
        """A line validate_prompt refuses, if this shard owns it (by its id, else by its line)."""
        owner = (
            shard_of_id(prompt_id, self.shard_count)
            if prompt_id is not None
            else shard_of_line(position, self.shard_count)
        )
        if owner != self.shard_index:
            return None
        return MalformedLine(position, problem.reason, excerpt(raw), prompt_id, problem.cause)

    def bad_line(self, position: int, reason: str, raw: bytes | str) -> MalformedLine | None:
        if shard_of_line(position, self.shard_count) == self.shard_index:
            return MalformedLine(position, reason, excerpt(raw), None, BAD_JSON)
        return None

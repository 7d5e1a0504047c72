"""One streamed pass over a dataset file (JSONL, a JSON array, Parquet): a shard's lines in dataset order, each
a valid prompt with its parsed object or a line set aside (ShardScan), read with the run's id field and sample."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from datagen_operator.prompts.dataset_ref import UTF8_BOM, UTF16_BOMS, DatasetError, DatasetRef
from datagen_operator.prompts.json_array import ArrayBreak, iter_json_array
from datagen_operator.prompts.line_shape import id_key, plain_prompt_id, validate_prompt
from datagen_operator.prompts.lines import MalformedLine, PromptRef, line_key
from datagen_operator.prompts.shards import DUPLICATE, Assigner

if TYPE_CHECKING:  # the spec models load pydantic: a scan without a sample needs none of it
    from datagen_operator.api.generation_spec import DatasetSample
    from datagen_operator.prompts.draws import SubsetRule


class LineSink(Protocol):
    """What a JSONL scan tells about every physical line it reads, as it reads it (prompts/pin.py's LinePins:
    the dataset pinned by the read that plans it)."""

    def update(self, data: bytes, /) -> None:
        """Bytes of the file not in the line handed over next (the byte order mark)."""

    def parsed(self, raw: bytes, obj: Any) -> None: ...

    def blank(self, raw: bytes) -> None: ...

    def unparsed(self, raw: bytes, stripped: bytes) -> None: ...

    def finish(self) -> None:
        """The end of the file: every line was handed over."""


class ShardScan:
    """One pass over the dataset, streamed: this shard's lines in dataset order, each a valid prompt (with
    its parsed object) or a line set aside. `lines_total` and `valid_lines_total` are known once the
    iteration is exhausted. Memory: the ids' hashes only. The dataset's id field (None: `id`) says where ids
    live. `lines`: a JSONL scan hands it every line it reads, every shard's (set before iterating). With the
    dataset's sample, only the subset's lines are yielded and counted as valid (prompts/draws.py), while
    `lines` and `lines_total` still see every line (the pin is the whole dataset's)."""

    def __init__(self, dataset: DatasetRef, shard_index: int, shard_count: int) -> None:
        if shard_count < 1 or not 0 <= shard_index < shard_count:
            raise DatasetError(f"shard index {shard_index} is outside 0..{shard_count - 1}")
        self.dataset = dataset
        self.path = dataset.path
        if not self.path.is_file():
            raise DatasetError(f"dataset {self.path} does not exist or is not a file")
        self.format = dataset.read_format()
        self.shard_index, self.shard_count = shard_index, shard_count
        self.id_field = dataset.id_field
        self.lines_total = 0
        self.valid_lines_total = 0
        self.lines: LineSink | None = None
        self.sample = dataset.sample
        self.subset: SubsetRule | None = None
        """The sample's rule over this file, once a scan started (a count's needs a pass of its own)."""

    def keeps(self) -> Callable[[str], bool] | None:
        """Whether a line of this identity (prompt id, else line key) is in the subset; None: every line is."""
        if self.sample is None:
            return None
        if self.subset is None:
            self.subset = _subset_rule(self.sample, replace(self.dataset, format=self.format))
        return self.subset.keeps

    def __iter__(self) -> Iterator[tuple[PromptRef, dict[str, Any]] | MalformedLine]:
        # The reader's own generator, not one wrapped around it: a layer per line less.
        if self.format == "jsonl":
            return _scan_jsonl(self)
        return _scan_json(self) if self.format == "json" else _scan_parquet(self)


_counted: dict[tuple[Any, ...], SubsetRule] = {}
"""Count rules by dataset file state and sample: one process reads a dataset to count it once."""


def _subset_rule(sample: DatasetSample, dataset: DatasetRef) -> SubsetRule:
    """The rule of `sample` over `dataset` (its format detected). A fraction's needs no read; a count's, one pass
    over the whole dataset (its valid prompts' ids), remembered while the file is unchanged."""
    from datagen_operator.prompts.draws import count_rule, fraction_rule

    if sample.fraction is not None:
        return fraction_rule(sample)
    stat = dataset.path.stat()
    key = (
        str(dataset.path),
        stat.st_size,
        stat.st_mtime_ns,
        dataset.format,
        dataset.id_field,
        sample.count,
        sample.seed,
    )
    rule = _counted.get(key)
    if rule is None:
        whole = ShardScan(replace(dataset, sample=None), 0, 1)  # duplicates come as MalformedLine: one id each
        rule = count_rule(sample, (item[0].id for item in whole if not isinstance(item, MalformedLine)))
        _counted[key] = rule
    return rule


def has_prompt(scan: ShardScan) -> bool:
    """Whether the dataset holds one valid prompt (any shard's), read with the scan's format and id field:
    stops at the first, so a usable dataset costs a line or two; one without any is read whole."""
    whole = ShardScan(replace(scan.dataset, format=scan.format), 0, 1)
    return any(not isinstance(item, MalformedLine) for item in whole)


def _scan_jsonl(scan: ShardScan) -> Generator[tuple[PromptRef, dict[str, Any]] | MalformedLine, None, None]:
    """This shard's lines; sets the scan's totals once exhausted. This loop runs once per dataset line, so
    the common case takes shortcuts that change no result (tests/worker/test_dataset_scan.py): the line is
    parsed as read (JSON ignores the whitespace `strip` would cut; a line that fails is stripped and parsed
    again, for the error the stripped line gives), a prompt of the common shape skips validate_prompt
    (plain_prompt_id), and names are bound to locals."""
    path = scan.path
    assigner = Assigner(scan.shard_index, scan.shard_count)
    take_valid, set_aside, bad_line = assigner.take_valid, assigner.set_aside, assigner.bad_line
    loads, decode_error, plain_id, validate = orjson.loads, orjson.JSONDecodeError, plain_prompt_id, validate_prompt
    id_field = scan.id_field
    id_name = id_key(id_field)
    sink = scan.lines
    keep = scan.keeps()
    position = -1
    valid = 0
    offset = 0
    with path.open("rb") as file:
        if file.read(2) in UTF16_BOMS:
            raise DatasetError(f"dataset {path} is UTF-16 (byte order mark); JSONL must be UTF-8")
        file.seek(0)
        # Positions are physical 0-based line numbers (blank lines are skipped, not renumbered).
        for position, line in enumerate(file):
            if position == 0 and line.startswith(UTF8_BOM):
                # Editors on Windows write one; the first prompt starts after it.
                line = line[len(UTF8_BOM) :]
                offset = len(UTF8_BOM)
                if sink is not None:
                    sink.update(UTF8_BOM)
            start = offset
            length = len(line)
            offset += length
            try:
                obj = loads(line)
            except decode_error:
                stripped = line.strip()
                if not stripped:
                    if sink is not None:
                        sink.blank(line)
                    continue
                try:
                    obj = loads(stripped)
                except decode_error as error:
                    if sink is not None:
                        sink.unparsed(line, stripped)
                    if keep is not None and not keep(line_key(position)):
                        continue
                    bad = bad_line(position, f"bad JSON: {error}", stripped)
                    if bad is not None:
                        yield bad
                    continue
            if sink is not None:
                sink.parsed(line, obj)
            prompt_id = plain_id(obj, id_name)
            integer = False
            if prompt_id is None:
                prompt_id, problem = validate(obj, id_field)
                if problem is not None:
                    if keep is not None and not keep(prompt_id or line_key(position)):
                        continue
                    aside = set_aside(position, prompt_id, problem, line.strip())
                    if aside is not None:
                        yield aside
                    continue
                assert prompt_id is not None
                integer = type(obj.get(id_name)) is int
            if keep is not None and not keep(prompt_id):
                continue
            valid += 1
            ref = take_valid(position, prompt_id, start, length)
            if type(ref) is PromptRef:
                if integer:
                    assigner.took_integer(prompt_id)
                yield ref, obj
            elif ref is DUPLICATE:
                yield assigner.duplicate(position, prompt_id, line.strip(), integer)
    scan.lines_total = position + 1
    scan.valid_lines_total = valid
    if sink is not None:
        sink.finish()


def _scan_json(scan: ShardScan) -> Generator[tuple[PromptRef, dict[str, Any]] | MalformedLine, None, None]:
    """A JSON array's elements as lines (position: the element's 0-based index; offset and length: its bytes),
    streamed (iter_json_array); where the array breaks, the rest is one more line, set aside as bad_json."""
    assigner = Assigner(scan.shard_index, scan.shard_count)
    id_field = scan.id_field
    id_name = id_key(id_field)
    keep = scan.keeps()
    position = 0
    valid = 0
    with scan.path.open("rb") as file:
        for item in iter_json_array(file, scan.path):
            if isinstance(item, ArrayBreak):
                bad = assigner.bad_line(position, item.reason, item.excerpt)
                if bad is not None and (keep is None or keep(line_key(position))):
                    yield bad
                position += 1
                break
            offset, data, obj = item
            prompt_id = plain_prompt_id(obj, id_name)
            problem = None
            if prompt_id is None:
                prompt_id, problem = validate_prompt(obj, id_field)
            if keep is not None and not keep(prompt_id or line_key(position)):
                pass
            elif problem is not None:
                aside = assigner.set_aside(position, prompt_id, problem, data[:200])
                if aside is not None:
                    yield aside
            else:
                assert prompt_id is not None
                valid += 1
                integer = type(obj.get(id_name)) is int
                ref = assigner.take_valid(position, prompt_id, offset, len(data))
                if isinstance(ref, PromptRef):
                    if integer:
                        assigner.took_integer(prompt_id)
                    yield ref, obj
                elif ref is DUPLICATE:
                    yield assigner.duplicate(position, prompt_id, data[:200], integer)
            position += 1
    scan.lines_total = position
    scan.valid_lines_total = valid


def _scan_parquet(scan: ShardScan) -> Generator[tuple[PromptRef, dict[str, Any]] | MalformedLine, None, None]:
    import pyarrow.parquet as pq

    path = scan.path
    assigner = Assigner(scan.shard_index, scan.shard_count)
    id_field = scan.id_field

    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:
        raise DatasetError(f"dataset {path} is not readable Parquet: {error}") from None
    keep = scan.keeps()
    position = 0
    valid = 0
    for batch in parquet.iter_batches(batch_size=4096):
        for obj in batch.to_pylist():
            obj = normalise_parquet_row(obj, id_field)
            raw = orjson.dumps(obj, default=str)[:200]
            prompt_id, problem = validate_prompt(obj, id_field)
            if keep is not None and not keep(prompt_id or line_key(position)):
                pass
            elif problem is not None:
                aside = assigner.set_aside(position, prompt_id, problem, raw)
                if aside is not None:
                    yield aside
            else:
                assert prompt_id is not None
                valid += 1
                ref = assigner.take_valid(position, prompt_id, -1, 0)
                if isinstance(ref, PromptRef):
                    yield ref, obj
                elif ref is DUPLICATE:
                    yield assigner.duplicate(position, prompt_id, raw)
            position += 1
    scan.lines_total = position
    scan.valid_lines_total = valid


def normalise_parquet_row(obj: dict[str, Any], id_field: str | None = None) -> dict[str, Any]:
    """Parquet has no free-form JSON: messages (or conversations) or tools may be stored as JSON strings,
    structs add nulls. `conversations` is touched only where `messages` is null, the one it is read from, so
    every row an older reader accepted keeps its pin hash. An integer `id` column is read as its decimal strings
    only where `id` is the id field (`id_field` None or "id"), as it always was; under another id field it is a
    column like any other and keeps its integers, as the same line in JSONL does."""
    if id_key(id_field) == "id":
        raw_id = obj.get("id")
        if isinstance(raw_id, int) and not isinstance(raw_id, bool):
            obj["id"] = str(raw_id)  # an integer column: one type for every row (prompts/line_shape.py)
    keys = ["messages", "tools"] if obj.get("messages") is not None else ["messages", "conversations", "tools"]
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str | bytes):
            with contextlib.suppress(orjson.JSONDecodeError):
                obj[key] = orjson.loads(value)
    for key in keys[:-1]:
        messages = obj.get(key)
        if isinstance(messages, list):
            obj[key] = [{k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in messages]
    return obj

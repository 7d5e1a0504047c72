"""What a shard needs before any server: its plan over the dataset, the tokenizer and renderers, and what
faithful outputs look like. BadInput (exit 2) names what is unusable.

The tokenizer's parts (`Tokenized`) need transformers, whose import is most of a worker's start-up. Where the
preflight's rendered store (output/rendered.py) was made under this worker's `start_key` (read from files alone),
they load after the first requests are queued: those send the stored ids and the stored sampling, and whatever
needs the tokenizer (rendering a line the store does not hold, a conversation's later turns, the record checks,
writing anything) waits for `Inputs.ready`. The loaded parts are then held to the store: a difference stops the
shard (FingerprintMismatch) before anything from those requests is written."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_FINGERPRINT_MISMATCH
from datagen_operator.api.reasons import Reason
from datagen_operator.checks.record_checks import Expectations, expectations_for
from datagen_operator.engine.model_configs import model_config_dir, read_model_eos_ids
from datagen_operator.engine.requests import run_sampling
from datagen_operator.output.fingerprint import chat_template_sha256
from datagen_operator.output.rendered import (
    RenderedPrompts,
    open_rendered,
    open_rendered_early,
    render_identity,
    start_key,
    start_values,
)
from datagen_operator.prompts.conversation import AnswerSplitter
from datagen_operator.prompts.dataset_ref import DatasetError
from datagen_operator.prompts.lean_render import RenderError
from datagen_operator.prompts.pin import read_pin, render_date
from datagen_operator.prompts.render import Renderer, RenderPool, load_tokenizer, template_variables
from datagen_operator.prompts.scan import ShardScan, has_prompt
from datagen_operator.prompts.summary import check_dataset
from datagen_operator.worker.config import BadInput, FingerprintMismatch, WorkerConfig

log = logging.getLogger("datagen.worker")

Fatal = Callable[[int, str, Reason], None]
"""How a load that failed after the first requests stops the shard (worker/stop.py `Stop.set_fatal`)."""


class InputsUnavailable(Exception):
    """The tokenizer's parts failed to load after the first requests: the shard is stopped (fatal) by then."""


@dataclass
class Tokenized:
    """What needs the tokenizer, so transformers."""

    tokenizer: Any
    """transformers' tokenizer (AutoTokenizer: its class depends on the model; untyped)."""
    renderer: Renderer
    expect: Expectations
    sampling: dict[str, Any]
    """The run's sampling params with the stop ids the tokenizer and model configs give."""
    splitter: AnswerSplitter | None = None
    """generation.turns all: how an answer becomes the next turn's history."""


@dataclass
class Inputs:
    plan: ShardScan
    """The shard's plan, streamed: the feeder reads it as requests go out."""
    render_pool: RenderPool
    """Helper processes rendering prompts (closed with the worker's session); its renderer set once loaded."""
    sampling: dict[str, Any]
    """The sampling params every /generate request of this run carries (stop tokens included)."""
    chat_template_sha256: str | None
    """The chat template's, as the data fingerprint holds it."""
    rendered: RenderedPrompts | None = None
    """The prompts the preflight rendered with this very renderer (output/rendered.py): sent as they are."""
    tokenized: Tokenized | None = None
    """Loaded at start without a matching store, else after the first requests (`load_after_first`)."""
    later: Callable[[], Awaitable[Tokenized]] | None = None
    """How `tokenized` loads after the first requests (None: loaded at start)."""
    _loading: asyncio.Task[Tokenized | None] | None = None
    _wanted: asyncio.Event | None = None

    @property
    def expect(self) -> Expectations:
        assert self.tokenized is not None, "the record checks wait for Inputs.ready"
        return self.tokenized.expect

    @property
    def splitter(self) -> AnswerSplitter | None:
        assert self.tokenized is not None, "a conversation's answers wait for Inputs.ready"
        return self.tokenized.splitter

    def expect_for(self, thinking: bool | None) -> Expectations:
        """What a faithful record of a line looks like (Expectations.for_line: its own thinking switch)."""
        return self.expect.for_line(thinking)

    def load_after_first(self, fatal: Fatal) -> None:
        """Load the tokenizer's parts (if not loaded) once the first requests are queued (`first_queued`) or
        something needs them (`ready`); a failure stops the shard through `fatal`."""
        if self.tokenized is None and self._loading is None and self.later is not None:
            self._wanted = asyncio.Event()
            self._loading = asyncio.create_task(self._load_late(self.later, self._wanted, fatal))

    def first_queued(self) -> None:
        if self._wanted is not None:
            self._wanted.set()

    async def ready(self) -> Tokenized:
        """The tokenizer's parts, waited for; InputsUnavailable when their load failed (the shard stopped)."""
        if self.tokenized is not None:
            return self.tokenized
        assert self._loading is not None and self._wanted is not None, "load_after_first starts the load"
        self._wanted.set()
        loaded = await asyncio.shield(self._loading)
        if loaded is None:
            raise InputsUnavailable
        return loaded

    async def _load_late(
        self, load: Callable[[], Awaitable[Tokenized]], wanted: asyncio.Event, fatal: Fatal
    ) -> Tokenized | None:
        await wanted.wait()
        try:
            tokenized = await load()
        except FingerprintMismatch as error:
            fatal(EXIT_FINGERPRINT_MISMATCH, str(error), Reason.FINGERPRINT_MISMATCH)
            return None
        except BadInput as error:
            fatal(EXIT_BAD_INPUT, str(error), error.reason)
            return None
        self.tokenized = tokenized
        gc.freeze()  # transformers' long-lived objects kept off the cyclic GC, as at start (worker/generation.py)
        log.info("tokenizer loaded after the first requests; the preflight's rendered prompts are this worker's")
        return tokenized


async def load_inputs(config: WorkerConfig) -> Inputs:
    c = config
    try:
        # The shard's plan streams (ShardScan, read by the feeder as requests go out): start-up does not
        # grow with the dataset. Only a dataset without one valid prompt is read whole here, to refuse
        # it (exit 2) naming why each line was set aside.
        plan = ShardScan(c.dataset_ref, c.shard_index, c.shard_count)
        if not await asyncio.to_thread(has_prompt, plan):
            await asyncio.to_thread(check_dataset, plan.dataset)
    except (DatasetError, OSError) as error:
        raise BadInput(f"dataset: {error}", Reason.DATASET_UNUSABLE) from None
    variables = template_variables(c.resolved, render_date(c.output))  # the pin is written by now
    render_pool = RenderPool(variables, c.tokenizer_dir, c.resolved.trust_remote_code, c.render_processes)
    pin = read_pin(c.output)
    key = start_key(c.spec, c.resolved, Path(c.tokenizer_dir), variables)
    store = open_rendered_early(c.output, key, pin.sha256 if pin is not None else None)
    if not isinstance(store, str):
        log.info("sending the prompts the preflight rendered (%d tokens); the tokenizer loads meanwhile", store.tokens)
        start = store.start
        later = partial(_load_held_to, c, render_pool, store)
        return Inputs(plan, render_pool, start["sampling"], start["chat_template_sha256"], store, later=later)
    try:
        tokenized = await _load_tokenized(c, render_pool)
    except BadInput:
        render_pool.close()
        raise
    renderer = tokenized.renderer
    return Inputs(
        plan, render_pool, tokenized.sampling, chat_template_sha256(renderer.chat_template),
        _rendered(c, renderer, store), tokenized,
    )  # fmt: skip


async def _load_tokenized(config: WorkerConfig, render_pool: RenderPool) -> Tokenized:
    """The tokenizer (transformers), its renderer (also the render pool's), the Expectations and the run's sampling."""
    c, spec = config, config.spec
    try:
        tokenizer = await asyncio.to_thread(
            load_tokenizer, c.tokenizer_dir, trust_remote_code=c.resolved.trust_remote_code
        )
        renderer = Renderer(tokenizer, render_pool.variables)
    except (OSError, ValueError, RenderError) as error:
        raise BadInput(f"tokenizer {c.tokenizer_dir}: {error}") from None
    render_pool.renderer = renderer
    model_dir = model_config_dir(spec.model.path, c.tokenizer_dir)
    expect = expectations_for(c.resolved, tokenizer, read_model_eos_ids(model_dir))
    sampling = run_sampling(spec.generation.sampling, expect.stop_token_ids)
    splitter = None
    if spec.generation.turns == "all":
        try:
            splitter = AnswerSplitter(
                tokenizer, c.resolved.reasoning_parser, renderer.chat_template, render_pool.variables,
                c.resolved.tool_call_parser,
            )  # fmt: skip
        except ValueError as error:
            raise BadInput(f"generation.turns: {error}") from None
    return Tokenized(tokenizer, renderer, expect, sampling, splitter)


async def _load_held_to(config: WorkerConfig, render_pool: RenderPool, store: RenderedPrompts) -> Tokenized:
    """The tokenizer's parts loaded after the first requests, held to what those sent (the store's identity,
    sampling and template): FingerprintMismatch names what differs (rendered.py makes that impossible for the
    same files; a store edited by hand or a library changed under the output is what it catches)."""
    tokenized = await _load_tokenized(config, render_pool)
    renderer = tokenized.renderer
    differ = store.differences(_identity(config, renderer), start_values(tokenized.sampling, renderer.chat_template))
    if differ:
        raise FingerprintMismatch(
            f"the preflight's rendered prompts ({config.output}/rendered) disagree with this worker's tokenizer on "
            f"{', '.join(differ)}: nothing sent from them is recorded. Run the preflight again (it renders anew)"
        )
    return tokenized


def _identity(config: WorkerConfig, renderer: Renderer) -> dict[str, Any]:
    generation = config.spec.generation
    return render_identity(
        renderer.template, renderer.variables, Path(config.tokenizer_dir), generation.turns,
        history_reasoning=generation.history_reasoning,
    )  # fmt: skip


def _rendered(config: WorkerConfig, renderer: Renderer, not_early: str) -> RenderedPrompts | None:
    """The preflight's rendered prompts when they were rendered as this worker renders, else None (said why).
    `not_early`: why they were not sent before the tokenizer was loaded."""
    pin = read_pin(config.output)
    store = open_rendered(config.output, _identity(config, renderer), pin.sha256 if pin is not None else None)
    if isinstance(store, str):
        log.info("rendering prompts in the worker: %s", store)
        return None
    log.info("sending the prompts the preflight rendered (%d tokens), the tokenizer loaded first: %s", store.tokens,
             not_early)  # fmt: skip
    return store

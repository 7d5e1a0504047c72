"""What a shard needs before any server: its plan over the dataset, the tokenizer and renderers, and what
faithful outputs look like. Loaded once; BadInput (exit 2) names what is unusable."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datagen_operator.api.reasons import Reason
from datagen_operator.checks.record_checks import Expectations, expectations_for
from datagen_operator.engine.model_configs import model_config_dir
from datagen_operator.engine.requests import run_sampling
from datagen_operator.output.rendered import RenderedPrompts, open_rendered, render_identity
from datagen_operator.prompts.conversation import AnswerSplitter
from datagen_operator.prompts.dataset_ref import DatasetError
from datagen_operator.prompts.lean_render import RenderError
from datagen_operator.prompts.pin import read_pin, render_date
from datagen_operator.prompts.render import Renderer, RenderPool, load_tokenizer, template_variables
from datagen_operator.prompts.scan import ShardScan, has_prompt
from datagen_operator.prompts.summary import check_dataset
from datagen_operator.worker.config import BadInput, WorkerConfig

log = logging.getLogger("datagen.worker")


@dataclass
class Inputs:
    plan: ShardScan
    """The shard's plan, streamed: the feeder reads it as requests go out."""
    tokenizer: Any
    """transformers' tokenizer (AutoTokenizer: its class depends on the model; untyped)."""
    renderer: Renderer
    render_pool: RenderPool
    """Helper processes rendering prompts (closed with the worker's session)."""
    expect: Expectations
    sampling: dict[str, Any]
    """The sampling params every /generate request of this run carries (stop tokens included)."""
    splitter: AnswerSplitter | None = None
    """generation.turns all: how an answer becomes the next turn's history."""
    rendered: RenderedPrompts | None = None
    """The prompts the preflight rendered with this very renderer (output/rendered.py): sent as they are."""

    def expect_for(self, thinking: bool | None) -> Expectations:
        """What a faithful record of a line looks like (Expectations.for_line: its own thinking switch)."""
        return self.expect.for_line(thinking)


async def load_inputs(config: WorkerConfig) -> Inputs:
    c, spec = config, config.spec
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
    # Helpers start loading the tokenizer now, in parallel with this process.
    render_pool = RenderPool(variables, c.tokenizer_dir, c.resolved.trust_remote_code, c.render_processes)
    try:
        tokenizer = await asyncio.to_thread(
            load_tokenizer, c.tokenizer_dir, trust_remote_code=c.resolved.trust_remote_code
        )
        renderer = Renderer(tokenizer, variables)
    except (OSError, ValueError, RenderError) as error:
        render_pool.close()
        raise BadInput(f"tokenizer {c.tokenizer_dir}: {error}") from None
    render_pool.renderer = renderer
    expect = expectations_for(c.resolved, tokenizer, model_config_dir(spec.model.path, c.tokenizer_dir))
    sampling = run_sampling(spec.generation.sampling, expect.stop_token_ids)
    splitter = None
    if spec.generation.turns == "all":
        try:
            splitter = AnswerSplitter(
                tokenizer, c.resolved.reasoning_parser, renderer.chat_template, variables, c.resolved.tool_call_parser
            )
        except ValueError as error:
            render_pool.close()
            raise BadInput(f"generation.turns: {error}") from None
    return Inputs(plan, tokenizer, renderer, render_pool, expect, sampling, splitter, _rendered(c, renderer))


def _rendered(config: WorkerConfig, renderer: Renderer) -> RenderedPrompts | None:
    """The preflight's rendered prompts when they were rendered as this worker renders, else None (said why)."""
    pin = read_pin(config.output)
    generation = config.spec.generation
    identity = render_identity(
        renderer.template, renderer.variables, Path(config.tokenizer_dir), generation.turns,
        history_reasoning=generation.history_reasoning,
    )  # fmt: skip
    store = open_rendered(config.output, identity, pin.sha256 if pin is not None else None)
    if isinstance(store, str):
        log.info("rendering prompts in the worker: %s", store)
        return None
    log.info("sending the prompts the preflight rendered (%d tokens)", store.tokens)
    return store

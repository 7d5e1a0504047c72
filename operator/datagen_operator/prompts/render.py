"""Prompts rendered to input_ids with the model's own tokenizer and chat template.

The rendered prompt, not the server, decides whether the model thinks: /generate applies no chat template to
`input_ids` (SGLang 0.5.23 sglang/srt/managers/io_struct.py `GenerateReqInput`), so the template's thinking
switch is passed here, and the ids go to /generate as they are.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datagen_operator.engine.chat_content import content_format, template_messages
from datagen_operator.engine.template_tools import template_tools
from datagen_operator.prompts.lean_render import Encoder, LeanRenderer, LeanSpec, RenderError, tokenizers_encoder

if TYPE_CHECKING:  # a render helper imports this module: nothing pydantic-heavy at import time
    from datagen_operator.api.resolve import ResolvedModel

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner per worker
log = logging.getLogger("datagen.worker.render")

Variables = Mapping[str, Any] | None
"""A line's own template variables (its chat_template_kwargs), rendered over the run's; None: the run's only."""

# Variables a template may read when no preset names the switch; unused variables are ignored by Jinja.
GENERIC_THINKING_SWITCHES = ("thinking", "enable_thinking")


RENDERED_ON = "datagen_rendered_on"
"""The variable that carries the output's render date (prompts/pin.py `rendered_on`) to every Renderer, helpers'
included; the Renderer takes it out and pins the template's clock with it (`pinned_template`)."""
_STRFTIME_CALL = re.compile(r"""strftime_now\(\s*(['"])(.*?)\1\s*\)""")


def pinned_template(template: str, rendered_on: str | None) -> str:
    """The template with `strftime_now` answering for `rendered_on`, so a prompt renders to the same ids whichever
    day the worker, the canary or verify renders it (gpt-oss writes `Current date:`). transformers hands templates
    only plain data (a clock passed as a variable arrives as a placeholder), so the clock is shadowed inside the
    template: a macro, defined first, answering each format the template asks for."""
    formats = sorted({match.group(2) for match in _STRFTIME_CALL.finditer(template)})
    if rendered_on is None or not formats:
        return template
    day = datetime.strptime(rendered_on, "%Y-%m-%d")
    answers = ", ".join(f"{json.dumps(f)}: {json.dumps(day.strftime(f))}" for f in formats)
    return f"{{%- macro strftime_now(format) -%}}{{{{ {{{answers}}}[format] }}}}{{%- endmacro -%}}\n{template}"


def template_variables(resolved: ResolvedModel, rendered_on: str | None = None) -> dict[str, Any]:
    """Extra chat-template variables: generation.templateVariables, the run's thinking switch, and the output's
    render date when known."""
    clock: dict[str, Any] = {RENDERED_ON: rendered_on} if rendered_on else {}
    return {**resolved.template_variables, **dict.fromkeys(thinking_switches(resolved), resolved.thinking), **clock}


def thinking_switches(resolved: ResolvedModel) -> tuple[str, ...]:
    """The template variables that switch thinking: the preset's, or the generic ones without a preset."""
    return _switches(resolved.preset is not None, resolved.preset.thinking.switch if resolved.preset else None)


def _switches(has_preset: bool, preset_switch: str | None) -> tuple[str, ...]:
    if has_preset:
        return (preset_switch,) if preset_switch else ()
    return GENERIC_THINKING_SWITCHES


def rendered_kwargs(run_kwargs: Mapping[str, Any], line: Variables) -> dict[str, Any]:
    """What one line is rendered with: the run's keyword arguments, its own chat_template_kwargs over them (as
    `Renderer.render` lays them)."""
    return {**run_kwargs, **(line or {})}


def fingerprint_template_kwargs(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-template keyword arguments every prompt of a run was rendered with (a line's own aside, the
    render date aside), read back from its output's fingerprint as `template_variables` builds them:
    generation.templateVariables and the thinking switch. ValueError: a preset this datagen does not know."""
    from datagen_operator.api.resolve import preset_thinking_switch  # pydantic-heavy: only where it is asked

    name = fingerprint.get("preset")
    switches = _switches(name is not None, preset_thinking_switch(name) if isinstance(name, str) else None)
    variables = fingerprint.get("template_variables") or {}
    return {**variables, **dict.fromkeys(switches, bool(fingerprint.get("thinking")))}


def line_switch(resolved: ResolvedModel, variables: Mapping[str, Any] | None) -> tuple[str, bool] | None:
    """The thinking switch a line sets itself: (the chat_template_kwargs key, its value), or None when it sets
    none the template reads (only a boolean switches: Qwen3's `enable_thinking is false` is false for "false")."""
    for name in thinking_switches(resolved) if variables else ():
        value = variables.get(name) if variables else None
        if isinstance(value, bool):
            return name, value
    return None


def line_thinking(resolved: ResolvedModel, variables: Mapping[str, Any] | None) -> bool:
    """Whether a line renders with thinking on: its own chat_template_kwargs' switch when it sets one (Qwen3's
    enable_thinking per line), else the run's."""
    switch = line_switch(resolved, variables)
    return resolved.thinking if switch is None else switch[1]


def load_tokenizer(tokenizer_dir: str | Path, *, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=trust_remote_code, local_files_only=True)


def backend_encoder(tokenizer: Any) -> Encoder | None:
    """The tokenizer's own encoder for rendered text, without transformers' Python layer: the Rust backend
    of a fast tokenizer, or the `tiktoken.Encoding` a tiktoken-backed remote-code tokenizer keeps as `.model`
    (Kimi-K2's `TikTokenTokenizer`, which has no tokenizer.json). None: render through transformers only."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        return tokenizers_encoder(backend)
    model = getattr(tokenizer, "model", None)
    if model is not None and type(model).__module__.split(".")[0] == "tiktoken":
        return lambda text: model.encode(text, allowed_special="all")  # added tokens in the text are ids
    return None


def lean_variables(tokenizer: Any, variables: dict[str, Any]) -> dict[str, Any]:
    """What apply_chat_template gives a template besides the chat: the special tokens, then the run's own."""
    return {**tokenizer.special_tokens_map, **variables}


def own_apply_chat_template(tokenizer: Any) -> str | None:
    """The tokenizer class that overrides transformers' `apply_chat_template`, or None. Such a class may render
    anything its own way (recent Kimi releases' remote code sorts the tools and writes them as TypeScript), and
    SGLang's chat endpoint calls it (serving_chat `_render_and_encode_chat_template`), so its prompts are its
    own: the template alone, rendered around it, is no proof of them."""
    for cls in type(tokenizer).__mro__:
        if "apply_chat_template" in vars(cls):
            is_base = cls.__name__ == "PreTrainedTokenizerBase" and cls.__module__.startswith("transformers.")
            return None if is_base else f"{cls.__module__}.{cls.__qualname__}"
    return None


def lean_renderer(tokenizer: Any, template: Any, variables: dict[str, Any]) -> LeanRenderer | str:
    """The lean renderer over a loaded tokenizer's own encoder, or why there is none."""
    own = own_apply_chat_template(tokenizer)
    if own is not None:
        return f"{own} overrides apply_chat_template: every prompt renders through it, as SGLang renders it"
    if not isinstance(template, str):
        return "the tokenizer has several named chat templates"
    encode = backend_encoder(tokenizer)
    if encode is None:
        return "the tokenizer has no backend encoder"
    try:
        return LeanRenderer(template, lean_variables(tokenizer, variables), encode)
    except Exception as error:  # a template only transformers' Jinja environment compiles
        return f"the chat template does not compile outside transformers: {type(error).__name__}: {error}"


class Renderer:
    """Renders with the model's own template and variables: the lean path (`LeanRenderer`: `render_chat` and
    the tokenizer's backend) where there is one, checked against the reference
    (`apply_chat_template(tokenize=True)`) on the first `CHECK_FIRST` prompts and every `CHECK_EVERY`th
    after; one difference switches to the reference for good (and is logged), so a template or tokenizer
    that transformers treats differently still renders exactly. `check` is the same comparison for ids a
    render helper made. A tokenizer whose class overrides `apply_chat_template` gets no lean path
    (`own_apply_chat_template`): a sample proves nothing about the prompts it does not hold (tools, say).
    """

    CHECK_FIRST = 16
    CHECK_EVERY = 256

    def __init__(self, tokenizer: Any, variables: dict[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.chat_template: str | None = getattr(tokenizer, "chat_template", None)
        """The model's own template, as the fingerprint records it."""
        if not self.chat_template:
            raise RenderError("the tokenizer has no chat template; pre-tokenized prompts need the model's own template")
        self.variables = {k: v for k, v in variables.items() if k != RENDERED_ON}
        self.template = (
            pinned_template(self.chat_template, variables.get(RENDERED_ON))
            if isinstance(self.chat_template, str)
            else self.chat_template
        )
        """What renders: the model's template, its clock pinned to the output's render date."""
        self.content_format = content_format(self.chat_template)
        """How serving_chat hands the template a list content (engine/chat_content.py)."""
        lean = lean_renderer(tokenizer, self.template, self.variables)
        if isinstance(lean, str):
            log.info("renderer: apply_chat_template for every prompt (%s)", lean)
        self.lean: LeanRenderer | None = None if isinstance(lean, str) else lean
        self.rendered = 0
        self.checked = 0
        """Lean renders compared with the reference (this process's and the helpers')."""
        self.fast_path_mismatch: str | None = None

    @classmethod
    def due_for_check(cls, count: int) -> bool:
        """Whether the `count`th lean render (1-based) is compared with the reference."""
        return count <= cls.CHECK_FIRST or count % cls.CHECK_EVERY == 0

    def reference(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, variables: Variables = None
    ) -> list[int]:
        """Exactly what the tokenizer's own `apply_chat_template` renders and tokenizes (the definition the lean
        path must match), with the tools SGLang's chat endpoint hands it (engine/template_tools.py); `variables`:
        a line's own template variables (its chat_template_kwargs), over the run's."""
        try:
            ids = self.tokenizer.apply_chat_template(
                template_messages(messages, self.content_format),
                tools=template_tools(tools),
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                chat_template=self.template,
                **({**self.variables, **variables} if variables else self.variables),
            )
        except Exception as error:  # jinja errors, template `raise_exception`, bad tool schemas
            raise RenderError(f"chat template failed: {type(error).__name__}: {error}") from None
        if ids and isinstance(ids[0], list):  # some tokenizers wrap a single conversation
            ids = ids[0]
        return list(ids)

    def check(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        ids: list[int],
        where: str,
        variables: Variables = None,
    ) -> list[int]:
        """The reference's ids for a prompt the lean path rendered as `ids`; a difference switches this
        renderer to the reference for good."""
        self.checked += 1
        expected = self.reference(messages, tools, variables)
        if expected != ids and self.fast_path_mismatch is None:
            self.fast_path_mismatch = f"{where}: lean ids differ from apply_chat_template"
            log.warning("renderer: %s; using apply_chat_template(tokenize=True) from now on", self.fast_path_mismatch)
        return expected

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, variables: Variables = None
    ) -> list[int]:
        self.rendered += 1
        if self.lean is None or self.fast_path_mismatch is not None:
            return self.reference(messages, tools, variables)
        try:
            ids = self.lean.render(messages, tools, variables)
        except RenderError:
            return self.reference(messages, tools, variables)  # the reference decides what is set aside
        if self.due_for_check(self.rendered):
            return self.check(messages, tools, ids, f"prompt #{self.rendered}", variables)
        return ids


def lean_spec(renderer: Renderer, tokenizer_dir: Path) -> LeanSpec | str:
    """What a render helper loads to render as `renderer`'s lean path does without transformers (the template,
    its variables and tokenizer.json), or why it cannot (then it loads the tokenizer with transformers)."""
    if renderer.lean is None:
        return "no lean path for this tokenizer or template"
    tokenizer_json = tokenizer_dir / "tokenizer.json"
    if not hasattr(getattr(renderer.tokenizer, "_tokenizer", None), "encode_batch") or not tokenizer_json.is_file():
        return "no tokenizer.json (a tiktoken or slow remote-code tokenizer)"
    return LeanSpec(renderer.lean.chat_template, renderer.lean.variables, tokenizer_json)


# --- rendering off the event loop ------------------------------------------------------------------
#
# Rendering (Jinja + tokenization) costs more CPU per prompt than sending it and storing the answer, and
# real prompts (long multi-turn chats, a slow trust_remote_code tokenizer) cost far more. Helper
# processes render batches ahead of the requests so the event loop only moves bytes.

RenderResult = bytes | str
"""int32 ids as bytes (cheap to pickle), or the reason the prompt cannot be rendered."""
RenderItem = tuple[list[dict[str, Any]], list[dict[str, Any]] | None, Mapping[str, Any] | None]
"""A prompt to render: its messages, tools and own template variables (a line's chat_template_kwargs)."""


@dataclass(frozen=True)
class FullSpec:
    """A render helper that loads the tokenizer with transformers, as the worker does (no lean path, or
    the worker found the lean one wrong: then `reference_only`)."""

    tokenizer_dir: str
    trust_remote_code: bool
    variables: dict[str, Any]
    reference_only: bool = False


_process_renderer: Renderer | LeanRenderer | None = None


def _die_with_parent() -> None:
    """Linux: a helper must not outlive a worker killed with SIGKILL."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _init_render_process(spec: LeanSpec | FullSpec) -> None:
    global _process_renderer
    _die_with_parent()
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the worker, which drains and stops us
    # Normal priority: a helper is started only once inline rendering limits the run (RenderPool), so it
    # is on the critical path; niced, it would lose the cores to what it was started to relieve.
    if isinstance(spec, LeanSpec):
        _process_renderer = LeanRenderer.from_spec(spec)
        return
    renderer = Renderer(load_tokenizer(spec.tokenizer_dir, trust_remote_code=spec.trust_remote_code), spec.variables)
    if spec.reference_only:
        renderer.fast_path_mismatch = "the worker found the lean path wrong"
    _process_renderer = renderer


def render_batch(
    render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, Variables], list[int]],
    items: list[RenderItem],
) -> list[RenderResult]:
    from array import array

    out: list[RenderResult] = []
    for messages, tools, variables in items:
        try:
            out.append(array("i", render(messages, tools, variables)).tobytes())
        except RenderError as error:
            out.append(str(error))
    return out


def _render_batch_in_process(items: list[RenderItem]) -> tuple[list[RenderResult], str | None]:
    assert _process_renderer is not None, "render process not initialised"
    mismatch = _process_renderer.fast_path_mismatch if isinstance(_process_renderer, Renderer) else None
    return render_batch(_process_renderer.render, items), mismatch


def ids_from_result(result: bytes) -> list[int]:
    from array import array

    ids = array("i")
    ids.frombytes(result)
    return ids.tolist()


HELPER_WINDOW_S = 2.0
HELPER_RENDER_SHARE = 0.2


def helper_needed(inline_render_s: float, window_s: float) -> bool:
    """Start a helper once rendering in the event loop took a fifth of a window of at least
    HELPER_WINDOW_S: it then limits how fast answers are moved. Below that a helper process (its own
    tokenizer, ~100 MB, seconds of CPU to start) costs more than it saves."""
    return window_s >= HELPER_WINDOW_S and inline_render_s >= HELPER_RENDER_SHARE * window_s


class RenderPool:
    """Renders batches inline (in the event loop's process) until that measurably limits the run
    (`helper_needed`), then in up to `processes` helper processes (spawned: no fork of a threaded event
    loop); inline again when the helpers died (it says so in the log and carries on).

    Nothing starts with the worker: the first requests go out rendered inline, and a run whose event loop
    has time to spare (a GPU server, long answers) never starts a helper at all.

    A helper loads only what the lean path needs (`lean_spec`), or, where there is none, the tokenizer with
    transformers (said once in the log). Either way the worker holds its helpers' ids to the reference as it
    holds its own (`Renderer.check`, same first prompts and period) and lets the reference decide every
    prompt a helper set aside; on a difference it re-renders that batch with the reference and its helpers
    render with the reference from then on."""

    def __init__(self, variables: dict[str, Any], tokenizer_dir: Path, trust_remote_code: bool, processes: int) -> None:
        self.renderer: Renderer | None = None
        """The in-process renderer (inline mode, reference checks, fallback); set once the tokenizer is loaded."""
        self.executor: Any = None
        self.processes = processes
        self.variables = variables
        self.tokenizer_dir = Path(tokenizer_dir)
        self.trust_remote_code = trust_remote_code
        self.helper_spec: LeanSpec | FullSpec | None = None
        """What the running helpers loaded."""
        self.helper_rendered = 0
        """Prompts helpers rendered (the count `Renderer.due_for_check` reads)."""
        self._mismatch_logged = False
        self._ready: list[Any] = []
        self._window_start: float | None = None
        self._inline_s = 0.0

    def _spec(self) -> LeanSpec | FullSpec:
        full = FullSpec(str(self.tokenizer_dir), self.trust_remote_code, self.variables)
        if self.renderer is None:
            return full
        if self.renderer.fast_path_mismatch is not None:
            return FullSpec(full.tokenizer_dir, full.trust_remote_code, full.variables, reference_only=True)
        lean = lean_spec(self.renderer, self.tokenizer_dir)
        if isinstance(lean, str):
            log.info("render helpers load the tokenizer with transformers: %s", lean)
            return full
        return lean

    def start(self, why: str) -> None:
        """Start the helpers now, not once inline rendering limits the run: for a pass that does nothing but
        render (the preflight), where they are the point."""
        if self.executor is None and self.processes > 0:
            self._start_helpers(why)

    def _start_helpers(self, why: str) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.helper_spec = self._spec()
        kind = "lean" if isinstance(self.helper_spec, LeanSpec) else "transformers"
        log.info("%s: starting %d %s render helper(s)", why, self.processes, kind)
        self.executor = ProcessPoolExecutor(
            max_workers=self.processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_render_process,
            initargs=(self.helper_spec,),
        )
        # They load the tokenizer meanwhile; until one has, rendering stays inline (never waits for them).
        self._ready = [self.executor.submit(int) for _ in range(self.processes)]

    def _stop_helpers(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None

    def _account_inline(self, seconds: float) -> None:
        import time

        now = time.monotonic()
        if self._window_start is None:
            self._window_start = now - seconds
        self._inline_s += seconds
        window = now - self._window_start
        if helper_needed(self._inline_s, window):
            self._start_helpers(f"rendering took {self._inline_s / window:.0%} of the event loop")
        elif window >= HELPER_WINDOW_S:
            self._window_start, self._inline_s = now, 0.0

    def _helpers_trusted(self) -> bool:
        """False once the lean path was found wrong (here or in a helper's ids) and the helpers still use it."""
        reference_only = isinstance(self.helper_spec, FullSpec) and self.helper_spec.reference_only
        return reference_only or self.renderer is None or self.renderer.fast_path_mismatch is None

    def _held_to_reference(self, items: list[RenderItem], results: list[RenderResult]) -> list[RenderResult]:
        """A helper's batch as the reference has it (see the class)."""
        renderer = self.renderer
        if renderer is None:  # no tokenizer in this process: the helpers are the renderer
            return results
        checked: list[RenderResult] = []
        for (messages, tools, variables), result in zip(items, results, strict=True):
            if isinstance(result, str):
                checked.extend(render_batch(renderer.reference, [(messages, tools, variables)]))
                continue
            self.helper_rendered += 1
            if renderer.due_for_check(self.helper_rendered):
                where = f"helper prompt #{self.helper_rendered}"
                renderer.check(messages, tools, ids_from_result(result), where, variables)
            if not self._helpers_trusted():
                self._stop_helpers()  # restarted (lazily) rendering with the reference
                return render_batch(renderer.reference, items)
            checked.append(result)
        return checked

    async def render(self, items: list[RenderItem]) -> list[RenderResult]:
        import asyncio
        import time
        from concurrent.futures.process import BrokenProcessPool

        if self.executor is None and self.renderer is None and self.processes > 0:
            self._start_helpers("no renderer in this process")
        if self.executor is not None and not self._helpers_trusted():
            self._stop_helpers()  # this process found the lean path wrong: so would they be (restarted lazily)
        if self.executor is not None and (self.renderer is None or any(f.done() for f in self._ready)):
            try:
                results, mismatch = await asyncio.get_running_loop().run_in_executor(
                    self.executor, _render_batch_in_process, items
                )
            except BrokenProcessPool as error:
                log.warning("render processes died (%s); rendering in the worker process from now on", error)
                self._stop_helpers()
                self.processes = 0
            else:
                if mismatch and not self._mismatch_logged:
                    self._mismatch_logged = True
                    log.warning("renderer: %s; helpers use apply_chat_template(tokenize=True) from now on", mismatch)
                return self._held_to_reference(items, results)
        assert self.renderer is not None
        started = time.perf_counter()
        results = render_batch(self.renderer.render, items)
        if self.executor is None and self.processes > 0:
            self._account_inline(time.perf_counter() - started)
        return results

    def close(self) -> None:
        """Stop the helpers and reap them (they are idle or finish one batch: milliseconds)."""
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None


def default_render_processes() -> int:
    """Half the cores (the other half for the event loop and the OS), at least 1, at most 4."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by its cgroup's CPU quota (a pod's CPU limit,
    cgroup v2 `cpu.max`), at least 1. `os.cpu_count()` is the node's, not the pod's."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period) + 0.5)))
    except (OSError, ValueError):
        pass
    return max(1, cores)

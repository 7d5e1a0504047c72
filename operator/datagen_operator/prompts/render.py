"""Prompts rendered to input_ids with the model's own tokenizer and chat template.

The rendered prompt, not the server, decides whether the model thinks (kimi-k2-format.md): the
template's thinking switch is passed here, and the ids go to /generate as they are.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datagen_operator.api.resolve import ResolvedModel

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner per worker
log = logging.getLogger("datagen.worker.render")

# Variables a template may read when no preset names the switch; unused variables are ignored by Jinja.
GENERIC_THINKING_SWITCHES = ("thinking", "enable_thinking")


class RenderError(ValueError):
    """A prompt the chat template cannot render (bad roles, bad tool schema): set aside, not retried."""


def template_variables(resolved: ResolvedModel) -> dict[str, Any]:
    """Extra chat-template variables that switch thinking on or off for this run."""
    preset = resolved.preset
    if preset is not None:
        switch = preset.thinking.switch
        return {switch: resolved.thinking} if switch else {}
    return dict.fromkeys(GENERIC_THINKING_SWITCHES, resolved.thinking)


def load_tokenizer(tokenizer_dir: str | Path, *, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=trust_remote_code, local_files_only=True)


def backend_encoder(tokenizer: Any) -> Callable[[str], list[int]] | None:
    """The tokenizer's own encoder for rendered text, without transformers' Python layer: the Rust backend
    of a fast tokenizer, or the `tiktoken.Encoding` a tiktoken-backed remote-code tokenizer keeps as `.model`
    (Kimi-K2's `TikTokenTokenizer`, which has no tokenizer.json). None: render through transformers only."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        return lambda text: backend.encode(text, add_special_tokens=False).ids
    model = getattr(tokenizer, "model", None)
    if model is not None and type(model).__module__.split(".")[0] == "tiktoken":
        return lambda text: model.encode(text, allowed_special="all")  # added tokens in the text are ids
    return None


class Renderer:
    """Renders with `apply_chat_template` (the model's own template and variables), tokenizing the text
    directly with the tokenizer's backend where there is one (`backend_encoder`): same ids, a third of the CPU.

    The fast path is checked against the reference (`apply_chat_template(tokenize=True)`) on the first
    `CHECK_FIRST` prompts and every `CHECK_EVERY`th after; one difference switches to the reference for
    good (and is logged), so a tokenizer whose __call__ does more than its backend still renders exactly.
    """

    CHECK_FIRST = 16
    CHECK_EVERY = 256

    def __init__(self, tokenizer: Any, variables: dict[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.variables = variables
        self.chat_template: str | None = getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise RenderError("the tokenizer has no chat template; pre-tokenized prompts need the model's own template")
        self._backend = backend_encoder(tokenizer)
        self.rendered = 0
        self.fast_path_mismatch: str | None = None

    def reference(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Exactly what transformers renders and tokenizes (the definition the fast path must match)."""
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **self.variables
            )
        except Exception as error:  # jinja errors, template `raise_exception`, bad tool schemas
            raise RenderError(f"chat template failed: {type(error).__name__}: {error}") from None
        if ids and isinstance(ids[0], list):  # some tokenizers wrap a single conversation
            ids = ids[0]
        return list(ids)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        self.rendered += 1
        if self._backend is None or self.fast_path_mismatch is not None:
            return self.reference(messages, tools)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False, **self.variables
            )
        except Exception as error:
            raise RenderError(f"chat template failed: {type(error).__name__}: {error}") from None
        ids: list[int] = self._backend(text)
        if self.rendered <= self.CHECK_FIRST or self.rendered % self.CHECK_EVERY == 0:
            expected = self.reference(messages, tools)
            if expected != ids:
                self.fast_path_mismatch = f"prompt #{self.rendered}: backend ids differ from apply_chat_template"
                log.warning(
                    "renderer: %s; using apply_chat_template(tokenize=True) from now on", self.fast_path_mismatch
                )
                return expected
        return ids


# --- rendering off the event loop ------------------------------------------------------------------
#
# Rendering (Jinja + tokenization) costs more CPU per prompt than sending it and storing the answer, and
# real prompts (long multi-turn chats, a slow trust_remote_code tokenizer) cost far more. Helper
# processes render batches ahead of the requests so the event loop only moves bytes.

RenderResult = bytes | str
"""int32 ids as bytes (cheap to pickle), or the reason the prompt cannot be rendered."""

_process_renderer: Renderer | None = None


def _die_with_parent() -> None:
    """Linux: a helper must not outlive a worker killed with SIGKILL."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _init_render_process(tokenizer_dir: str, trust_remote_code: bool, variables: dict[str, Any]) -> None:
    global _process_renderer
    _die_with_parent()
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the worker, which drains and stops us
    # Normal priority: a helper is started only once inline rendering limits the run (RenderPool), so it
    # is on the critical path; niced, it would lose the cores to what it was started to relieve.
    _process_renderer = Renderer(load_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code), variables)


def render_batch(
    renderer: Renderer, items: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]
) -> tuple[list[RenderResult], str | None]:
    from array import array

    out: list[RenderResult] = []
    for messages, tools in items:
        try:
            out.append(array("i", renderer.render(messages, tools)).tobytes())
        except RenderError as error:
            out.append(str(error))
    return out, renderer.fast_path_mismatch


def _render_batch_in_process(
    items: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]],
) -> tuple[list[RenderResult], str | None]:
    assert _process_renderer is not None, "render process not initialised"
    return render_batch(_process_renderer, items)


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
    has time to spare (a GPU server, long answers) never starts a helper at all."""

    def __init__(self, variables: dict[str, Any], tokenizer_dir: Path, trust_remote_code: bool, processes: int) -> None:
        self.renderer: Renderer | None = None
        """The in-process renderer (inline mode and fallback); set once the tokenizer is loaded."""
        self.executor: Any = None
        self.processes = processes
        self._helper_args = (str(tokenizer_dir), trust_remote_code, variables)
        self._mismatch_logged = False
        self._ready: list[Any] = []
        self._window_start: float | None = None
        self._inline_s = 0.0

    def _start_helpers(self, why: str) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        log.info("%s: starting %d render helper(s)", why, self.processes)
        self.executor = ProcessPoolExecutor(
            max_workers=self.processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_render_process,
            initargs=self._helper_args,
        )
        # They load the tokenizer meanwhile; until one has, rendering stays inline (never waits for them).
        self._ready = [self.executor.submit(int) for _ in range(self.processes)]

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

    async def render(self, items: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]) -> list[RenderResult]:
        import asyncio
        import time
        from concurrent.futures.process import BrokenProcessPool

        if self.executor is None and self.renderer is None and self.processes > 0:
            self._start_helpers("no renderer in this process")
        if self.executor is not None and (self.renderer is None or any(f.done() for f in self._ready)):
            try:
                results, mismatch = await asyncio.get_running_loop().run_in_executor(
                    self.executor, _render_batch_in_process, items
                )
            except BrokenProcessPool as error:
                log.warning("render processes died (%s); rendering in the worker process from now on", error)
                self.executor.shutdown(wait=False, cancel_futures=True)
                self.executor = None
                self.processes = 0
            else:
                if mismatch and not self._mismatch_logged:
                    self._mismatch_logged = True
                    log.warning("renderer: %s; helpers use apply_chat_template(tokenize=True) from now on", mismatch)
                return results
        assert self.renderer is not None
        started = time.perf_counter()
        results = render_batch(self.renderer, items)[0]
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

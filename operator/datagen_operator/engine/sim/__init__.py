"""A CPU simulator of SGLang's HTTP API (`datagen sim-server`), held to SGLang 0.5.23's own code by tests/contract
(docs/sglang-fidelity.md lists each behaviour, the simulator's version of it and the test).

Functional core: `model` (token streams), `tokens` (token runs with cached encodings), `sampling` (request
validation), `reasoning` (parser splits), `formats` (tool calls per family), `faults` (fault decisions),
`protocol` (response bodies and stream events), `chat` (OpenAI endpoint), `resolution` (argument resolution),
`prefix_cache` (`cached_tokens`). Imperative shell: `config` (arguments), `vocab` (the tokenizer directory, loaded
once), `server` (aiohttp handlers, pacing, process lifecycle) and `metrics`.
"""

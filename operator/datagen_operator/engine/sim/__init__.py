"""A CPU simulator of SGLang's HTTP API (`datagen sim-server`), held to shared/reference/sglang-contract.md.

Functional core: `model` (token streams), `sampling` (request validation), `reasoning` (parser splits),
`faults` (fault decisions), `protocol` (response bodies and stream events), `chat` (OpenAI endpoint).
Imperative shell: `server` (aiohttp handlers, pacing, process lifecycle) and `metrics`.
"""

"""The `datagen worker` program: one shard of a dataset through SGLang /generate into the record store.

The libraries it drives live below it: `prompts` (dataset, rendering), `engine.client` (HTTP), `output`
(the store). Here: `progress` (counters and their sinks), `metrics`, `main` (the command).
"""

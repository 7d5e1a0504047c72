"""The `datagen worker` program: one shard of a dataset through SGLang /generate into the record store.

The libraries it drives live below it: `prompts` (dataset, rendering), `engine.client` (HTTP), `output`
(the store). Here the worker is a set of small parts, each with one responsibility, built once by
`main.Worker` and handed the parts it works with: `startup` (its steps), `lease`, `inputs`, `servers`,
`progress` (the tracker and its sinks), `stop`, `jobs`, `volume_guard`, `ledger`, `publisher`, `feeder`,
`lanes`, `generation`, `finishing`, `failure`, `shard_files`, `metrics`; `config` is the command line.
"""

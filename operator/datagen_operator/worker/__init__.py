"""The generation worker: one shard of a dataset through SGLang /generate into crash-safe records.

Layout: `dataset` (read + shard), `render` (chat template -> input_ids), `client` (/generate over HTTP),
`store` (segments, resume, compaction, manifest, public readers), `fingerprint`, `progress`, `metrics`,
`main` (the `datagen worker` command).
"""

"""`datagen export`: the run's exact token records as the files trainers read (no re-tokenization).

Functional core in `formats` (pure: a batch of records in, rows/tables out) and `conversations` (whole regenerated
conversations: which are whole, their rows and masks, their text), thin I/O around it:
`reader` streams the store shard by shard, `writer` rolls bounded-size files, `manifest` describes the
export, `vocab_freq` counts output tokens over the vocabulary, `run` ties them together (and the CLI).
"""

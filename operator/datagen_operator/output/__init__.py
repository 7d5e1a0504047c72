"""The record store: the output directory's layout, crash-safe segments, Parquet compaction, the manifest
and its fingerprint, and the readers that verify and export use."""

"""Faithfulness checks over raw token records, the canary gate, and `datagen verify`."""

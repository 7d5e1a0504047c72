"""The pure faithfulness rules: per-record checks over raw token ids, the counted checks and their thresholds,
prompt fidelity, the template check, sample comparison. No I/O (tests/unit/test_layers.py holds them to it):
the step programs that read outputs, call servers and print verdicts are steps/."""

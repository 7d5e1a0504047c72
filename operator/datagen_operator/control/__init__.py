"""The decision core shared by the operator and the local runner: observed state in, conditions and the
next step out. Pure functions over data; no I/O here."""

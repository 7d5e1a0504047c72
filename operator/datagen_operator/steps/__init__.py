"""The step programs: the preflight, the parser check, the canary, the render pass and `datagen verify` (with its
reports). They read datasets and outputs, call servers and print verdicts, and judge with the pure rules of
checks/."""

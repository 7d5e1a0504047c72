"""A function submitted to a render helper: it imports nothing, so what it returns is what the helper loaded."""

import sys


def loaded_modules() -> list[str]:
    return sorted(sys.modules)

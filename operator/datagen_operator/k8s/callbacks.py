"""What kopf hands our callbacks, narrowed to what they are for us.

kopf's callback protocols (`kopf.on.*`, `kopf.index`, `kopf.daemon`) name every keyword it may pass, with the
types it promises for any resource: `namespace: str | None`, since a cluster-scoped object has none. A handler
is checked against them by mypy --strict as any other call, so it takes the keyword as promised and narrows it
here.
"""

from __future__ import annotations

import kopf


def namespaced(namespace: str | None) -> str:
    """Every kind the operator handles is namespaced (the runs and their children): one that comes without a
    namespace is a bug to say, not a key to make up."""
    if namespace is None:
        raise kopf.PermanentError("a namespaced object came without its namespace")
    return namespace

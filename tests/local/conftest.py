from __future__ import annotations

from tests.worker.volume import small_volume  # noqa: F401 (a size-limited filesystem for full-volume tests)

"""`datagen worker`: generate one shard of a run. What the client Job pods and the local runner execute.

Exit codes: api/exit_codes.py (docs/worker.md explains each).
"""

from __future__ import annotations

import asyncio
import logging
import os

from datagen_operator.api.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_FINGERPRINT_MISMATCH,
    EXIT_OUTPUT_VOLUME,
)
from datagen_operator.worker.config import (
    BadInput,
    FingerprintMismatch,
    build_parser,
    config_from_args,
    setup_logging,
)
from datagen_operator.worker.startup import Startup

log = logging.getLogger("datagen.worker")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_format)
    try:
        config = config_from_args(args, dict(os.environ))
    except BadInput as error:
        log.error("%s", error)
        return EXIT_BAD_INPUT
    return asyncio.run(Worker(config).run())


class Worker(Startup):
    """One shard's worker; `run` maps how it ended to the exit code."""

    async def run(self) -> int:
        try:
            return await self._run()
        except BadInput as error:
            log.error("%s", error)
            return self._fail(EXIT_BAD_INPUT, str(error))
        except FingerprintMismatch as error:
            log.error("%s", error)
            return self._fail(EXIT_FINGERPRINT_MISMATCH, str(error))
        except OSError as error:
            from datagen_operator.output.volume import is_volume_error, volume_reason

            if not is_volume_error(error):
                raise
            # Failed before generation (the manifest, the reserve): nothing was generated.
            message, reason = self._volume_text(error), volume_reason(error)
            return self._fail(EXIT_OUTPUT_VOLUME, message, reason)

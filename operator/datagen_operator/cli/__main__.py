"""`python -m datagen_operator.cli`: what the images and the local runner start."""

import sys

from datagen_operator.cli import main

sys.exit(main())

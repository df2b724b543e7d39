"""``python -m nursery_jobs_lint``: the same entry point as the ``nursery-jobs-lint`` script.

This repository's own pre-commit hook runs the lint this way from the dev environment
(``language: unsupported``), so it needs no separate install of a console script.
"""

import sys

from .cli import main

sys.exit(main())

"""`python -m nursery_jobs.cli`: the `nursery-jobs` command without its console script."""

import sys

from . import main

sys.exit(main())

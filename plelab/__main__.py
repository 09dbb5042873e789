"""`python -m plelab` is the `plelab` command."""

import sys

from plelab.cli.main import main

sys.exit(main())

"""`python -m warehouse.cli`: how daemons and tests run the CLI with this interpreter."""

import sys

from warehouse.cli import main

sys.exit(main())

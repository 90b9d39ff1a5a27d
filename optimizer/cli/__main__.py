"""`python -m optimizer.cli` (how the TUI and the tests start detached runs)."""

import sys

from optimizer.cli import main

sys.exit(main())

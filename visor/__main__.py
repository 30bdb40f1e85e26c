"""`python -m visor`: the same as the `visor` command."""

import sys

from visor.cli import main

sys.exit(main())

"""``python -m dse`` runs the ``dse`` command (as ``python -m dse.cli`` does)."""

import sys

from dse.cli.main import main

sys.exit(main())

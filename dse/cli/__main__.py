"""``python -m dse.cli`` runs the ``dse`` command."""

import sys

from dse.cli.main import main

sys.exit(main())

"""``python -m outbox_relay`` runs the command line."""

import sys

from outbox_relay.cli import main

sys.exit(main())

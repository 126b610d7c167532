"""``python -m bench.report``: see bench/report/main.py."""

from bench.report.main import main

raise SystemExit(main())

"""`python -m harness <command> ...`: the same entry point as the `harness` console script."""

from harness.cli import main

raise SystemExit(main())

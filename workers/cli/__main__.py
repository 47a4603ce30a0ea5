"""`python -m workers.cli ...` runs gpuctl."""

from __future__ import annotations

from workers.cli.main import main

raise SystemExit(main())

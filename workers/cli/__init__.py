"""`gpuctl`: the console's command-line client for people and CI pipelines.

It talks only to the REST API (`/api/v1/`) over HTTP; it never imports the console.
"""

from __future__ import annotations

from workers.cli.main import main

__all__ = ["main"]

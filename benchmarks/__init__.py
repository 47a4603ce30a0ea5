"""Benchmarks: scripts that print figures (not tests). Run them as `python benchmarks/<name>.py`."""

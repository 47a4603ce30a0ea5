"""What runs inside a job: presets applied to user PyTorch code, progress reports, checkpoints.

No Django, no Celery: this package is imported by job processes on GPU hosts.
"""

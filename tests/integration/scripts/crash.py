"""A training script with a bug."""

print("loading data", flush=True)
raise RuntimeError("CUDA out of patience")

"""Run under torchrun by test_distributed.py: trains a tiny model under the job's preset and writes what
each rank observed to <out_dir>/rank<N>.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from tests.runtime.helpers import TinyBatchNormNet, TinyMLP, tiny_loader
from workers.runtime import session


def main(out_dir: Path, model_name: str) -> None:
    if os.environ.get("RANK") != "0" and os.environ.get("PROBE_OTHER_RANKS_CHECKPOINT_DIR"):
        # As on a second host: the other ranks do not see rank 0's checkpoint directory.
        os.environ["CONSOLE_CHECKPOINT_DIR"] = os.environ["PROBE_OTHER_RANKS_CHECKPOINT_DIR"]
    rt = session.start()
    torch.manual_seed(0)
    model = TinyBatchNormNet(width=16) if model_name == "batchnorm" else TinyMLP(width=16)
    model, optimizer, loader = rt.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                          tiny_loader(batch_size=8, samples=64))
    seen: dict = {"rank": rt.rank, "world_size": rt.world_size, "model_type": type(model).__name__,
                  "sampler": [loader.sampler.num_replicas, loader.sampler.rank], "indices": list(loader.sampler),
                  "autocast": []}
    for x, y in rt.batches(loader, epochs=2):
        with rt.step_context():
            enabled = torch.is_autocast_enabled("cpu")
            seen["autocast"].append(str(torch.get_autocast_dtype("cpu")) if enabled else None)
            loss = F.cross_entropy(model(x).float(), y)
        rt.backward(loss)
        if rt.optimizer_step():
            rt.report(loss=loss)
    params = dict(rt.module.named_parameters())
    seen["dtensor"] = all(isinstance(p, DTensor) for p in params.values())
    if seen["dtensor"]:
        seen["placements"] = sorted({str(p.placements) for p in params.values()})
        seen["local_numel"] = sum(p.to_local().numel() for p in params.values())
        full = {name: p.full_tensor() for name, p in params.items()}  # a collective: every rank calls it
    else:
        full = {name: p.detach() for name, p in params.items()}
    seen["full_numel"] = sum(t.numel() for t in full.values())
    seen["checksum"] = float(sum(t.double().sum() for t in full.values()))
    seen["steps"] = rt.step
    seen["precision"] = [rt.precision.name, rt.precision.autocast]
    seen["resumed_from"] = rt.resumed_from
    rt.finish()
    (out_dir / f"rank{seen['rank']}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "mlp")

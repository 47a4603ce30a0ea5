"""The catalogue of optimization presets and built-in workloads, as plain data.

The console validates job specs against it and lists it over the API; the runtime applies the presets it names.
Importing this module must stay cheap (no torch import).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

JobKind = Literal["train", "inference"]


@dataclass(frozen=True)
class Preset:
    name: str
    kind: JobKind
    description: str
    settings: dict[str, Any]
    needs_gpu: bool = False
    multi_process: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Param:
    type: Literal["int", "float", "str", "bool"]
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    kinds: tuple[JobKind, ...]
    description: str
    params: dict[str, Param] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kinds": list(self.kinds),
            "description": self.description,
            "params": {name: {k: v for k, v in asdict(p).items() if v is not None} for name, p in self.params.items()},
        }


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in [
        Preset("baseline-fp32", "train", "Plain fp32 training: the reference every preset is measured against.",
               {"precision": "fp32"}),
        Preset("amp-bf16", "train", "Automatic mixed precision in bfloat16 (torch.amp.autocast); no loss scaling needed.",
               {"precision": "bf16", "autocast": True}),
        Preset("amp-fp16", "train", "Automatic mixed precision in float16 with a GradScaler; falls back to bf16 on the CPU.",
               {"precision": "fp16", "autocast": True, "grad_scaler": True}, needs_gpu=True),
        Preset("ddp", "train", "Data parallel over the job's GPUs with DistributedDataParallel and bf16 autocast; "
               "one process per GPU under torchrun (NCCL on GPUs, gloo on CPU-only hosts).",
               {"distributed": "ddp", "precision": "bf16", "autocast": True}, multi_process=True),
        Preset("memory-saver", "train", "Activation checkpointing plus gradient accumulation up to a target global batch.",
               {"activation_checkpointing": True, "gradient_accumulation": "auto", "micro_batches": 4,
                "precision": "bf16", "autocast": True}),
        Preset("throughput", "train", "bf16 autocast, torch.compile, channels-last for conv nets, fused optimizer and a "
               "tuned data loader (workers, pinned memory, prefetch).",
               {"precision": "bf16", "autocast": True, "compile": True, "channels_last": True, "fused_optimizer": True,
                "loader": {"num_workers": 2, "pin_memory": True, "prefetch_factor": 2}}),
        Preset("fsdp", "train", "Fully sharded data parallel (FSDP2 fully_shard) for models that do not fit one GPU.",
               {"distributed": "fsdp2", "precision": "bf16"}, multi_process=True),
        Preset("prune-finetune", "train", "Magnitude pruning to a target sparsity (torch.nn.utils.prune), then fine-tuning.",
               {"prune": {"method": "l1_unstructured", "sparsity": 0.5}}),
        Preset("distill", "train", "Knowledge distillation: a smaller student trained on a teacher's softened logits.",
               {"distill": {"temperature": 2.0, "alpha": 0.5, "student_width": 0.5}}),
        Preset("infer-fp32", "inference", "Batched fp32 inference: the reference for the inference presets.",
               {"precision": "fp32"}),
        Preset("infer-fp16", "inference", "Batched inference in float16; bf16 on CPU-only hosts.",
               {"precision": "fp16"}, needs_gpu=True),
        Preset("infer-bf16", "inference", "Batched inference in bfloat16.", {"precision": "bf16"}),
        Preset("infer-int8", "inference", "Dynamic int8 quantization of linear layers with torchao.",
               {"quantize": "int8_dynamic"}),
        Preset("infer-compiled", "inference", "Batched inference through torch.compile.", {"compile": True}),
    ]
}

_COMMON_TRAIN = {
    "epochs": Param("int", 2, "passes over the data", min=1, max=10_000),
    "batch_size": Param("int", 64, "samples per step (per process)", min=1, max=65_536),
    "lr": Param("float", 1e-3, "learning rate", min=0.0, max=10.0),
    "seed": Param("int", 0, "random seed", min=0, max=2**31 - 1),
    "checkpoint": Param("str", "", "model file to start from: the weights to serve (inference), the initial "
                        "weights (training) or the teacher (distill); default: none, or $CONSOLE_MODEL_PATH"),
    "infer_passes": Param("int", 3, "inference: passes over the input set (every batch is timed)",
                          min=1, max=1000),
}

WORKLOADS: dict[str, Workload] = {
    workload.name: workload
    for workload in [
        Workload("mlp-digits", ("train", "inference"),
                 "A multilayer perceptron classifying scikit-learn's shipped 8x8 handwritten digits.",
                 {**_COMMON_TRAIN, "hidden": Param("int", 256, "hidden width", min=1, max=65_536),
                  "depth": Param("int", 2, "hidden layers", min=1, max=256)}),
        Workload("cnn-digits", ("train", "inference"),
                 "A small convolutional network classifying scikit-learn's shipped digits (upsampled to 32x32).",
                 {**_COMMON_TRAIN, "channels": Param("int", 32, "channels of the first conv layer", min=1, max=4096)}),
        Workload("tiny-lm", ("train", "inference"),
                 "A small character-level transformer language model trained on a text corpus shipped in the repo.",
                 {**_COMMON_TRAIN,
                  "layers": Param("int", 2, "transformer layers", min=1, max=96),
                  "d_model": Param("int", 128, "model width", min=8, max=16_384),
                  "heads": Param("int", 4, "attention heads (reduced until they divide d_model)", min=1, max=256),
                  "seq_len": Param("int", 64, "context length", min=8, max=8192)}),
    ]
}


def validate_params(workload: Workload, params: dict[str, Any]) -> dict[str, str]:
    """Field errors (param -> message) for a workload's params; empty when valid."""
    errors: dict[str, str] = {}
    for name, value in params.items():
        spec = workload.params.get(name)
        if spec is None:
            errors[name] = f"unknown parameter; {workload.name} takes: {', '.join(sorted(workload.params))}"
            continue
        if spec.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            errors[name] = "must be an integer"
        elif spec.type == "float" and (isinstance(value, bool) or not isinstance(value, int | float)):
            errors[name] = "must be a number"
        elif spec.type == "bool" and not isinstance(value, bool):
            errors[name] = "must be true or false"
        elif spec.type == "str" and not isinstance(value, str):
            errors[name] = "must be a string"
        elif spec.choices is not None and value not in spec.choices:
            errors[name] = f"must be one of {', '.join(spec.choices)}"
        elif spec.min is not None and value < spec.min:
            errors[name] = f"must be at least {spec.min:g}"
        elif spec.max is not None and value > spec.max:
            errors[name] = f"must be at most {spec.max:g}"
    return errors

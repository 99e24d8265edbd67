"""``train``: the optimizer, the schedule, the workers, checkpoints and the loss."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from raycpt.config.checks import check_field, check_rate, check_seed


@dataclass
class TrainConfig:
    lr: float = 3e-5
    """Peak learning rate (AdamW)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW betas."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    warmup_ratio: float = 0.1
    """Fraction of steps with linear warmup."""
    scheduler: Literal["linear", "cosine", "constant_with_warmup"] = "linear"
    """transformers scheduler after warmup."""
    max_steps: int = 40
    """Optimizer steps."""
    micro_batch_size: int = 4
    """Blocks per worker per micro-step."""
    grad_accum: int = 1
    """Micro-steps per optimizer step."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 = off)."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto = bf16 autocast on GPU, float32 on CPU."""
    num_workers: int = 1
    """Ray Train workers (data parallel)."""
    use_gpu: bool = False
    """One GPU per worker."""
    cpus_per_worker: float = 1.0
    """CPUs per worker (fractional on a small machine so data tasks are not starved)."""
    distributed: Literal["ddp", "fsdp"] = "ddp"
    """Data-parallel wrapper raycpt applies: ddp, or fsdp (FSDP2 per decoder layer, >= 2 workers; frozen layers stay frozen)."""
    seed: int = 0
    """Seed of init, data order and dropout."""
    checkpoint_every: int = 20
    """Save a checkpoint every N optimizer steps (and at the end)."""
    keep_checkpoints: int = 2
    """Keep the last K checkpoints."""
    keep_finished_checkpoints: bool = True
    """Keep the checkpoints (optimizer state included) once the run has finished and published ``final_model/``;
    false = delete them then (a sweep's trials, unless ``sweep.keep_checkpoints``): nothing resumes a finished run."""
    publish: Literal["copy", "reference"] = "copy"
    """How ``final_model/`` gets its weights: copy (a folder that stands alone), or reference (the layers equal to
    the base model become links to its per-layer shards under ``<run_root>/base_shards``, written once per run root:
    a sweep's trials store only what they trained; ``from_pretrained`` loads either)."""
    max_failures: int = 2
    """Worker failures tolerated (resume from the last checkpoint)."""
    log_every: int = 1
    """Log metrics every N steps."""
    drift_every: int = 0
    """Every N steps log per-layer weight change and probe CKA against the start (0 = off)."""
    loss: Literal["auto", "chunked", "plain"] = "auto"
    """chunked = LM head + loss over chunks of tokens (never the full logits); plain = full logits; auto = chunked for
    vocabularies >= 32768 (plain under FSDP)."""
    loss_chunk_tokens: int = 1024
    """Tokens per chunk of the chunked loss (smaller = less memory, more kernel launches)."""
    activation_checkpointing: bool = False
    """Recompute the trainable layers' activations in backward (the model's gradient_checkpointing_enable)."""
    device_memory_gb: Optional[float] = None
    """Memory of one worker's device in GB for the pre-launch estimate; None = detected on a GPU, unchecked on CPU."""
    peak_tflops: Optional[float] = None
    """Peak dense TFLOP/s of one worker's device for MFU; None = a table of known GPUs (no MFU on CPU)."""

    def __post_init__(self):
        check_rate("train.lr", self.lr)
        check_seed("train.seed", self.seed)
        check_field(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "train.betas", self.betas,
               "two numbers in [0, 1)")
        check_field(0 <= self.warmup_ratio < 1, "train.warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        check_field(self.max_steps >= 1, "train.max_steps", self.max_steps, "an integer >= 1")
        check_field(self.micro_batch_size >= 1, "train.micro_batch_size", self.micro_batch_size, "an integer >= 1")
        check_field(self.grad_accum >= 1, "train.grad_accum", self.grad_accum, "an integer >= 1")
        check_field(self.num_workers >= 1, "train.num_workers", self.num_workers, "an integer >= 1")
        check_field(self.checkpoint_every >= 1, "train.checkpoint_every", self.checkpoint_every, "an integer >= 1")
        check_field(self.keep_checkpoints >= 1, "train.keep_checkpoints", self.keep_checkpoints, "an integer >= 1")
        check_field(self.max_failures >= 0, "train.max_failures", self.max_failures, "an integer >= 0")
        check_field(self.max_grad_norm >= 0, "train.max_grad_norm", self.max_grad_norm, "a number >= 0")
        check_field(self.drift_every >= 0, "train.drift_every", self.drift_every, "an integer >= 0")
        check_field(self.loss_chunk_tokens >= 1, "train.loss_chunk_tokens", self.loss_chunk_tokens,
               "an integer >= 1 (tokens per chunk of the chunked loss; train.loss=plain for the full-logits loss)")
        check_field(self.device_memory_gb is None or self.device_memory_gb > 0, "train.device_memory_gb",
               self.device_memory_gb, "a positive number of GB or null")
        check_field(self.peak_tflops is None or self.peak_tflops > 0, "train.peak_tflops", self.peak_tflops,
               "a positive number or null")

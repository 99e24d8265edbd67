"""``hybrid``: a hybrid build's donors, new layers and segments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from raycpt.config.checks import check_field, check_seed


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
        check_field(len(self.builds) > 0, "hybrid.builds", self.builds, "a non-empty list of " + ", ".join(HYBRID_BUILDS))
        for b in self.builds:
            check_field(b in HYBRID_BUILDS, "hybrid.builds", b, "one of " + ", ".join(HYBRID_BUILDS))
        check_field(self.depth is None or (self.depth >= 2 and self.depth % 2 == 0), "hybrid.depth", self.depth,
               "an even integer >= 2 (half new, half donor layers) or null")
        if "custom" in self.builds:
            check_field(len(self.segments) > 0, "hybrid.segments", self.segments,
                   "a non-empty list of segments ({donor, layers: [start, end)} or {new: KIND, count: N}) "
                   "for the custom build")
        check_seed("hybrid.init_seed", self.init_seed)
        for i, seg in enumerate(self.segments):
            name = f"hybrid.segments[{i}]"
            if seg.init_seed is not None:
                check_seed(f"{name}.init_seed", seg.init_seed)
            check_field(bool(seg.new) != bool(seg.layers), name, vars(seg),
                   "either donor layers {donor, layers: [start, end)} or new layers {new: KIND, count: N}, not both")
            if seg.new:
                check_field(seg.count >= 1, f"{name}.count", seg.count, "an integer >= 1 for new layers")
            else:
                check_field(len(seg.layers) == 2 and 0 <= seg.layers[0] < seg.layers[1], f"{name}.layers", seg.layers,
                       "a donor layer range [start, end) with 0 <= start < end")

"""A hybrid's spec resolved: segments (donor layer ranges, fresh layers of a kind) -> :class:`HybridPlan`
(configs only, no weights); see :mod:`raycpt.models.hybrid.model`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from transformers import AutoConfig, PretrainedConfig

from raycpt.config import ModelConfig
from raycpt.errors import RaycptError
from raycpt.models.hybrid.model import DROP_KEYS, ALIASES, KINDS, LayerKind, layer_kind, slice_config, sub_config
from raycpt.models.sources import resolve_model_path


# ------------------------------------------------------------------------------------------------
# the spec: segments -> resolved plan (configs only, no weights)


INIT_MODES = ("identity", "fresh")


def init_mode(value, what: str = "hybrid.init") -> str:
    """``value`` as an init mode (None = ``identity``), or one clear error."""
    value = "identity" if value is None else str(value)
    if value not in INIT_MODES:
        raise RaycptError(f"{what}={value!r}: unknown init; use identity (new layers start as an identity on "
                          "the residual stream) or fresh (their architecture's own init)")
    return value


@dataclass
class Segment:
    """One resolved segment of a hybrid (configs only; no weights yet)."""

    kind: str
    """Layer kind (transformers model_type)."""
    count: int
    """Number of layers."""
    trainable: bool
    """Whether the segment trains."""
    config: dict
    """Plain config dict of the segment's architecture (``num_hidden_layers = count``)."""
    donor: Optional[str] = None
    """Donor reference (None = new layers)."""
    donor_path: Optional[str] = None
    """Resolved donor folder."""
    layers: Optional[tuple[int, int]] = None
    """Donor layer range [start, end)."""
    init_seed: int = 0
    """Seed of the fresh init (new layers)."""
    init: str = "identity"
    """New layers: ``identity`` (residual writes zeroed, :func:`zero_residual_writes`) or ``fresh``."""
    zero_writes: bool = False
    """Donor layers: zero their residual-stream projections after the copy (block expansion's identity copies)."""

    @property
    def source(self) -> str:
        return "new" if self.donor is None else f"{self.donor} [{self.layers[0]}, {self.layers[1]})"


@dataclass
class HybridPlan:
    """A hybrid resolved against its donors' configs: what :func:`build_hybrid` will assemble."""

    name: str
    """Build name (``new_shallow``, ``new_deep``, ``custom``)."""
    segments: list[Segment]
    head_donor: str
    """Reference of the donor of embeddings, final norm and head."""
    head_path: str
    """Its resolved folder."""
    base: dict = field(default_factory=dict)
    """Head donor's config as a plain dict."""

    @property
    def num_layers(self) -> int:
        return sum(s.count for s in self.segments)

    @property
    def trainable_layers(self) -> list[int]:
        out, i = [], 0
        for s in self.segments:
            if s.trainable:
                out.extend(range(i, i + s.count))
            i += s.count
        return out


def resolve_donor(ref: str, model_cfg=None) -> str:
    """A donor reference -> its local folder, through the one resolver
    (:func:`raycpt.models.sources.resolve_model_path`) under ``model_cfg``'s cache and hub revision
    (a :class:`raycpt.config.ModelConfig`; None = the defaults)."""
    return resolve_model_path(model_cfg or ModelConfig(ref=str(ref)), str(ref))


def donor_config(path: str) -> PretrainedConfig:
    return AutoConfig.from_pretrained(path)


def new_layer_config(kind: LayerKind, count: int, base: PretrainedConfig, overrides: dict) -> dict:
    """Config dict for ``count`` fresh layers of ``kind`` with the head donor's hidden size.

    Attention kinds inherit the donor's attention geometry when the donor is an attention model;
    Mamba2-style kinds get ``expand * hidden`` inner width in heads of 64 (or the largest of
    32/16/8 that divides it). ``overrides`` (the segment's ``config``) win over everything.
    """
    hidden = base.hidden_size
    d: dict[str, Any] = dict(hidden_size=hidden, vocab_size=8, num_hidden_layers=count,
                             initializer_range=getattr(base, "initializer_range", 0.02))
    base_kind = KINDS.get(ALIASES.get(base.model_type, base.model_type))
    if kind.call == "attention":
        if base_kind is not None and base_kind.call == "attention" and base_kind.name == kind.name:
            d.update(slice_config(base, 0, 1))
            d.update(hidden_size=hidden, vocab_size=8, num_hidden_layers=count)
            d.pop("layer_types", None)
        elif base_kind is not None and base_kind.call == "attention":
            for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                      "max_position_embeddings", "rms_norm_eps", "rope_parameters", "hidden_act"):
                if getattr(base, k, None) is not None:
                    d[k] = getattr(base, k)
        else:
            heads = max(1, hidden // 64)
            while hidden % heads:
                heads -= 1
            d.update(num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
                     intermediate_size=4 * hidden)
    elif kind.call in ("mamba2", "nemotron_h"):
        expand = int(overrides.get("expand", 2))
        inner = expand * hidden
        head_dim = int(overrides.get("head_dim" if kind.call == "mamba2" else "mamba_head_dim",
                                     next((c for c in (64, 32, 16, 8) if inner % c == 0), 1)))
        heads = max(1, inner // head_dim)
        if kind.call == "mamba2":
            d.update(expand=expand, head_dim=head_dim, num_heads=heads, state_size=64, n_groups=1)
        else:
            d.update(expand=expand, mamba_head_dim=head_dim, mamba_num_heads=heads, ssm_state_size=64, n_groups=1,
                     layers_block_type=(["linear_attention", "mlp"] * count)[:count],
                     intermediate_size=4 * hidden)
            heads_a = max(1, hidden // 64)
            while hidden % heads_a:
                heads_a -= 1
            d.update(num_attention_heads=heads_a, num_key_value_heads=heads_a, head_dim=hidden // heads_a)
        eps = getattr(base, "rms_norm_eps", None) or getattr(base, "layer_norm_epsilon", None)
        if eps:
            d["layer_norm_epsilon"] = eps
    d.update(overrides)
    d["num_hidden_layers"] = count
    d["model_type"] = kind.name
    return d


def shorthand_segments(build: str, donor: str, donor_layers: int, depth: Optional[int], new_kind: str,
                       new_config: Optional[dict] = None, init_seed: int = 0, init: str = "identity") -> list[dict]:
    """The paper's two builds as segment dicts (1:1 ratio: ``depth/2`` new + ``depth/2`` donor layers).

    ``new_shallow``: new layers first (trained), then the donor's *deep* layers (frozen).
    ``new_deep``: the donor's *shallow* layers first (trained), then new layers (frozen).
    """
    depth = donor_layers if depth is None else int(depth)
    if depth < 2 or depth % 2:
        raise RaycptError(f"hybrid.depth={depth}: must be an even number >= 2 (half new layers, half donor layers)")
    half = depth // 2
    if half > donor_layers:
        raise RaycptError(f"hybrid.depth={depth}: needs {half} donor layers but the donor has {donor_layers}; "
                          f"use a depth <= {2 * donor_layers}")
    new = dict(new=new_kind, count=half, config=dict(new_config or {}), init_seed=init_seed, init=init)
    if build == "new_shallow":
        return [dict(new, trainable=True), dict(donor=donor, layers=[donor_layers - half, donor_layers],
                                                trainable=False)]
    if build == "new_deep":
        return [dict(donor=donor, layers=[0, half], trainable=True), dict(new, trainable=False)]
    raise RaycptError(f"hybrid build {build!r}: unknown; use new_shallow, new_deep or custom")


def plan_hybrid(segments: list[dict], head_donor: str, name: str = "custom", model_cfg=None) -> HybridPlan:
    """Check and resolve a segment list against the donors' configs (no weights are loaded).

    Each segment dict is ``{donor, layers: [start, end), trainable}`` or
    ``{new: kind, count, trainable, init_seed?, init?, config?}`` (``init``: ``identity``, the default,
    or ``fresh``). Raises one :class:`RaycptError` per
    problem: empty list, unknown kind, a range outside the donor, a hidden-size mismatch.
    """
    if not segments:
        raise RaycptError("hybrid.segments=[]: a hybrid needs at least one segment "
                          "({donor: REF, layers: [start, end)} or {new: KIND, count: N})")
    head_path = resolve_donor(head_donor, model_cfg)
    base = donor_config(head_path)
    layer_kind(base.model_type, f"hybrid head donor {head_donor!r} (model_type)")
    hidden = base.hidden_size
    donors: dict[str, tuple[str, PretrainedConfig]] = {str(head_donor): (head_path, base)}
    out: list[Segment] = []
    for i, seg in enumerate(segments):
        where = f"hybrid.segments[{i}]"
        seg = dict(seg)
        if seg.get("new"):
            kind = layer_kind(seg["new"], f"{where}.new")
            count = int(seg.get("count") or 0)
            if count < 1:
                raise RaycptError(f"{where}.count={seg.get('count')!r}: new layers need a count >= 1")
            overrides = dict(seg.get("config") or {})
            if int(overrides.get("hidden_size", hidden)) != hidden:
                raise RaycptError(f"{where} ({kind.name}, new) has hidden size {overrides['hidden_size']} but the "
                                  f"head donor {head_donor!r} has {hidden}: all segments must share one hidden size")
            cfg = new_layer_config(kind, count, base, overrides)
            try:
                sub = sub_config(kind.name, cfg)
            except Exception as e:  # transformers' config validators raise several types
                msg = " ".join(str(getattr(e, "__cause__", None) or e).split())
                raise RaycptError(f"{where}.config: not a valid {kind.name} config: {msg}") from None
            if sub.hidden_size != hidden:  # pragma: no cover - hidden_size is set from the donor above
                raise RaycptError(f"{where} ({kind.name}, new) has hidden size {sub.hidden_size} but the head donor "
                                  f"{head_donor!r} has {hidden}: all segments must share one hidden size")
            out.append(Segment(kind=kind.name, count=count, trainable=bool(seg.get("trainable", True)),
                               config=cfg, init_seed=int(seg.get("init_seed") or 0),
                               init=init_mode(seg.get("init"), f"{where}.init")))
            continue
        ref = seg.get("donor") or head_donor
        if str(ref) not in donors:
            path = resolve_donor(ref, model_cfg)
            donors[str(ref)] = (path, donor_config(path))
        path, dcfg = donors[str(ref)]
        kind = layer_kind(dcfg.model_type, f"{where}.donor {ref!r} (model_type)")
        rng = seg.get("layers")
        n = dcfg.num_hidden_layers
        if not isinstance(rng, (list, tuple)) or len(rng) != 2:
            raise RaycptError(f"{where}.layers={rng!r}: give a donor layer range [start, end)")
        a, b = int(rng[0]), int(rng[1])
        if not (0 <= a < b <= n):
            raise RaycptError(f"{where}.layers=[{a}, {b}): outside donor {ref!r}, which has {n} layers "
                              f"(allowed: 0 <= start < end <= {n})")
        if dcfg.hidden_size != hidden:
            raise RaycptError(f"{where} (donor {ref!r} layers [{a}, {b})) has hidden size {dcfg.hidden_size} but "
                              f"the head donor {head_donor!r} has {hidden}: all segments must share one hidden size")
        out.append(Segment(kind=kind.name, count=b - a, trainable=bool(seg.get("trainable", True)),
                           config=slice_config(dcfg, a, b), donor=str(ref), donor_path=path, layers=(a, b),
                           zero_writes=bool(seg.get("zero_writes", False))))
    base_dict = {k: v for k, v in base.to_dict().items() if k not in DROP_KEYS}
    return HybridPlan(name=name, segments=out, head_donor=str(head_donor), head_path=head_path, base=base_dict)


def plan_from_config(hcfg, build: str, model_ref: str, model_cfg=None) -> HybridPlan:
    """Resolve build ``build`` of a :class:`raycpt.config.HybridConfig` (``model_ref`` = default donor;
    ``model_cfg``: the :class:`raycpt.config.ModelConfig` whose cache and revision donors resolve under)."""
    donor = hcfg.donor or model_ref
    head = hcfg.head_donor or donor
    if build == "custom":
        segs = [{**vars(s), "init": s.init or hcfg.init} for s in hcfg.segments]
        return plan_hybrid(segs, head, name="custom", model_cfg=model_cfg)
    layer_kind(hcfg.new_kind, "hybrid.new_kind")
    path = resolve_donor(donor, model_cfg)
    n = donor_config(path).num_hidden_layers
    segs = shorthand_segments(build, donor, n, hcfg.depth, hcfg.new_kind, hcfg.new_config, hcfg.init_seed,
                              hcfg.init)
    return plan_hybrid(segs, head, name=build, model_cfg=model_cfg)

"""The one config tree: ``ExperimentConfig`` and its sections.

Each section is a dataclass whose attributes carry a docstring-style comment; ``__post_init__``
checks ranges and raises :class:`~raycpt.errors.ConfigError` naming the field, the bad value
and what is allowed. YAML in (:func:`load_config`), YAML out (:func:`save_config`, which reloads
the file it wrote as a check), dotted overrides (``train.lr=1e-4``) through :func:`apply_overrides`.

Type checking and unknown-key detection are generic over the dataclass annotations, so adding a
field is one line plus its check.
"""

from __future__ import annotations

from raycpt.config.coerce import config_from_dict, config_to_dict
from raycpt.config.compare import CompareConfig
from raycpt.config.contribution import ContributionConfig
from raycpt.config.data import DataConfig, ReplayConfig
from raycpt.config.decide import DecideConfig
from raycpt.config.docs import field_docs
from raycpt.config.eval import EvalConfig
from raycpt.config.experiment import ExperimentConfig
from raycpt.config.hybrid import HYBRID_BUILDS, HybridConfig, HybridSegmentConfig
from raycpt.config.loading import load_config, save_config
from raycpt.config.model import ModelConfig
from raycpt.config.overrides import apply_overrides, config_with, set_dotted
from raycpt.config.plan import PlanConfig
from raycpt.config.ray import RayConfig
from raycpt.config.report import ReportConfig
from raycpt.config.select import SelectConfig
from raycpt.config.sweep import SweepConfig
from raycpt.config.trace import TraceConfig, trace_dtype
from raycpt.config.tracking import TrackingConfig
from raycpt.config.train import TrainConfig
from raycpt.config.yaml_io import MAX_CONFIG_BYTES, MAX_CONFIG_NODES, read_yaml, read_yaml_documents
from raycpt.errors import ConfigError

__all__ = [
    "CompareConfig", "ConfigError", "ContributionConfig", "DataConfig", "DecideConfig", "EvalConfig", "ExperimentConfig",
    "HYBRID_BUILDS", "HybridConfig", "HybridSegmentConfig", "MAX_CONFIG_BYTES", "MAX_CONFIG_NODES", "ModelConfig",
    "PlanConfig", "RayConfig", "ReplayConfig", "ReportConfig", "SelectConfig", "SweepConfig",
    "TraceConfig", "TrackingConfig", "TrainConfig", "apply_overrides", "config_from_dict", "config_to_dict",
    "config_with", "field_docs", "load_config", "read_yaml", "read_yaml_documents", "save_config", "set_dotted", "trace_dtype",
]

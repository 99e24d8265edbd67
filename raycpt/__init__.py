"""raycpt: which layers to train and which to freeze in continued pre-training, proven on Ray."""

__version__ = "0.1.0"

# Cheap (no transformers import): lets AutoConfig / AutoModelForCausalLM load saved hybrids
# (model_type raycpt_hybrid) in any process that imports raycpt - see raycpt/models/__init__.py.
from raycpt import models as _models  # noqa: E402,F401
# The registries (raycpt.registry) the config checks names against, filled here: the plans (@register_plan) and
# the selectors (declared in raycpt.diagnostics, their score functions imported lazily): cheap (no torch).
from raycpt import strategies as _strategies  # noqa: E402,F401
from raycpt import diagnostics as _diagnostics  # noqa: E402,F401

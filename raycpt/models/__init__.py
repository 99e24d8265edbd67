"""Models: references -> local folders (sources), the layer view (stack), hybrid builds (hybrid).

Importing this package makes a saved hybrid (``model_type: raycpt_hybrid``) loadable through
``AutoConfig`` / ``AutoModelForCausalLM.from_pretrained(folder)`` without ``trust_remote_code`` -
in the driver, in Ray workers and inside lm-eval - while keeping the import cheap:

* the (light) hybrid config class is registered with ``AutoConfig`` right after transformers'
  auto-config module is imported (at once if it already is);
* the model class registers itself with ``AutoModelForCausalLM`` the first time a hybrid config
  is instantiated, which ``from_pretrained`` does before it looks the model class up: the config
  calls ``hybrid_config.on_new_config``, which this package sets to :func:`_register_model`
  (the config module never imports the model module; this package knows both).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings

_AUTO = "transformers.models.auto.configuration_auto"


def _register_model() -> None:
    """Import :mod:`raycpt.models.hybrid.model` (it registers the model class at its end) unless it is loading."""
    if "raycpt.models.hybrid.model" in sys.modules:  # loaded, or loading (it registers itself at its end)
        return
    import raycpt.models.hybrid.model  # noqa: F401 - lazy: torch and transformers' modeling code


def _register_config() -> None:
    from raycpt.models.hybrid import config as hybrid_config
    hybrid_config.on_new_config = _register_model
    hybrid_config.register_config()


class _AfterAutoConfig(importlib.abc.MetaPathFinder):
    """Registers the hybrid config right after ``configuration_auto`` has been executed.

    Stays on ``sys.meta_path`` until that happened (a bare ``find_spec`` probe does not use it up)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _AUTO:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module
        finder = self

        def exec_module(module):
            original(module)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            try:
                _register_config()
            except Exception as e:  # pragma: no cover - never break the user's transformers import
                warnings.warn(f"raycpt: could not register the hybrid config class: {e!r}")

        spec.loader.exec_module = exec_module
        return spec


if _AUTO in sys.modules:
    _register_config()
elif not any(isinstance(f, _AfterAutoConfig) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterAutoConfig())

"""Hybrid builds: new layer kinds beside pretrained donor layers.

* :mod:`~raycpt.models.hybrid.config` - the light ``RaycptHybridConfig`` (registered with ``AutoConfig`` by
  :mod:`raycpt.models`); it never imports the model module.
* :mod:`~raycpt.models.hybrid.model` - the model class and its layer kinds (torch, transformers' modeling code).
* :mod:`~raycpt.models.hybrid.plans` - which layer comes from which donor; :mod:`~raycpt.models.hybrid.build` - the
  build itself; :mod:`~raycpt.models.hybrid.expand` - block expansion.

This file imports nothing, so importing the config module stays light.
"""

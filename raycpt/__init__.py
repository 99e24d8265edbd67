"""raycpt: which layers to train and which to freeze in continued pre-training, proven on Ray."""

__version__ = "0.1.0"

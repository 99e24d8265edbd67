"""THE figure writer: every figure raycpt draws is saved by :func:`save_figure` (written aside in its own
folder, renamed into place, the figure closed), so a reader never finds half a PNG under its final name."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def save_figure(fig, path: Path, dpi=None, **savefig_kw) -> Path:
    """Save ``fig`` to ``path``: ``fig.savefig`` into a hidden temporary file in the same folder (created when
    missing), close the figure, ``os.replace`` the file into place; returns ``path``.

    ``dpi`` and ``savefig_kw`` (``bbox_inches``, ``format``, ...) go to ``savefig`` as given; without ``dpi``
    matplotlib's own default applies (``savefig.dpi``: the figure's dpi). The format defaults to the path's
    suffix (PNG without one)."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    savefig_kw.setdefault("format", path.suffix[1:] or "png")
    if dpi is not None:
        savefig_kw["dpi"] = dpi
    fig.savefig(tmp, **savefig_kw)
    plt.close(fig)
    os.replace(tmp, path)
    return path

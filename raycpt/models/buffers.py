"""Non-persistent buffers after a load: what a saved folder does not hold, rebuilt from the model's own constructor.

``from_pretrained`` builds a model on the meta device and fills what the checkpoint holds; a buffer registered
with ``persistent=False`` (Gemma 3's ``embed_tokens.embed_scale``, every rotary ``inv_freq``) is not in the
checkpoint, so it gets whatever the class's ``_init_weights`` writes, and a class whose ``_init_weights`` skips it
(the hybrid's scaled embedding: 1.2e-38 in one load of a small Gemma 3 expansion, 1.1e24 in another) keeps
uninitialised memory. :func:`restore_buffers` rebuilds the model's skeleton with its parameters on the meta device
and its buffers real (``accelerate.init_empty_weights(include_buffers=False)``: the constructor computes every
buffer as a fresh model would, at no parameter memory) and writes each non-persistent buffer from it, so every
load path gives the function the saved model had.
"""

from __future__ import annotations

import copy


def non_persistent_buffers(model) -> dict:
    """``{name: tensor}`` of every non-persistent buffer of ``model`` (the names ``named_buffers`` gives)."""
    out = {}
    for mod_name, mod in model.named_modules():
        for b in getattr(mod, "_non_persistent_buffers_set", ()):
            t = mod._buffers.get(b)
            if t is not None:
                out[f"{mod_name}.{b}" if mod_name else b] = t
    return out


def reference_buffers(model) -> dict:
    """The non-persistent buffers a freshly constructed ``type(model)`` of the same config holds (on the CPU),
    built with its parameters on the meta device."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        fresh = type(model)(copy.deepcopy(model.config))
    return {k: v.detach() for k, v in non_persistent_buffers(fresh).items()}


def restore_buffers(model) -> list[str]:
    """Write every non-persistent buffer of ``model`` from :func:`reference_buffers` (in the buffer's own dtype and
    device); returns the names whose value changed (they held something other than the fresh model's value)."""
    import torch

    ref = reference_buffers(model)
    changed = []
    with torch.no_grad():
        for name, buf in non_persistent_buffers(model).items():
            want = ref.get(name)
            if want is None or want.shape != buf.shape:
                continue
            want = want.to(dtype=buf.dtype, device=buf.device)
            if not torch.equal(buf, want):
                changed.append(name)
                buf.copy_(want)
    return changed

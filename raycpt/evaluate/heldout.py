"""The held-out loss: mean next-token cross-entropy of packed token blocks, per block and token-weighted."""

from __future__ import annotations


def lm_block_losses(model, blocks: list[list[int]], batch_size: int = 8) -> list[float]:
    """Mean next-token cross-entropy (nats) of each packed block: ``len(block) - 1`` predictions each,
    in float32, as the model's own loss over that block alone. Kept per block so a loss difference
    between two models gets a paired bootstrap interval over blocks (:func:`raycpt.stats.paired_delta`).

    The model is evaluated in eval mode without the KV cache and left in the mode it was in."""
    import torch

    out: list[float] = []
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for i in range(0, len(blocks), batch_size):
                ids = torch.tensor(blocks[i:i + batch_size], dtype=torch.long, device=device)
                logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
                ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                       reduction="none")
                out += ce.view(ids.shape[0], -1).mean(dim=1).tolist()
    finally:
        if was_training:
            model.train()
    return out


def block_weights(blocks: list[list[int]]) -> list[int]:
    """Predictions per block (its length - 1): the weights that make the block losses' mean the token mean."""
    return [len(b) - 1 for b in blocks]


def lm_loss(model, blocks: list[list[int]], batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over all predictions of the packed blocks, as the training
    loop computes it: the token-weighted mean of :func:`lm_block_losses`."""
    losses = lm_block_losses(model, blocks, batch_size)
    w = block_weights(blocks)
    return sum(x * n for x, n in zip(losses, w)) / sum(w)

"""Every load path gives the saved model's function (ARCHITECTURE.md): per architecture row of
``models/stack.py``'s TABLE and a Gemma3-headed hybrid, a model saved and reloaded through the launcher's own path
(``train.prepare.resolve_model_path`` -> ``models.sources.load_model``) gives bitwise-equal logits to the model in
memory, and its block expansion (``plan.name=expand``, the cached expanded folder) starts at the base model's
loss (rel. 1e-6). The reference is the model that was saved, run in this process; nothing of raycpt computes it.

Before ``models/buffers.py`` the Gemma 3 rows failed: the non-persistent ``embed_tokens.embed_scale`` of the
expanded (hybrid-class) model came back as uninitialised memory."""

import pytest
import torch
import transformers as T

from raycpt.config import load_config
from raycpt.models.buffers import non_persistent_buffers, restore_buffers
from raycpt.models.hybrid.build import build_hybrid, save_hybrid
from raycpt.models.hybrid.plans import plan_hybrid
from raycpt.models.sources import load_model
from raycpt.models.stack import TABLE
from raycpt.train.driver.prepare import resolve_model_path
from tiny import save_tiny, tiny_model, tiny_tokenizer

ROWS = ["llama", "qwen2", "qwen3", "gemma3", "mamba2", "nemotron_h"]


def _ids():
    return torch.randint(4, 128, (2, 12), generator=torch.Generator().manual_seed(7))


def _through_launcher(folder, tmp_path, *over):
    cfg = load_config(None, [f"model.ref={folder}", f"model.cache_dir={tmp_path / 'cache'}", *over])
    return load_model(resolve_model_path(cfg), dtype="float32", device="cpu")[0]


def test_every_row_of_the_table_is_covered():
    names = {T.AutoConfig.for_model(a if a != "gemma3" else "gemma3_text").model_type for a in ROWS}
    assert set(TABLE) - names == {"mistral"}  # mistral is llama's layer class under another name


@pytest.mark.parametrize("arch", ROWS)
def test_reload_gives_bitwise_equal_logits(tmp_path, arch):
    model = tiny_model(arch, num_layers=4)
    model.save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    again = _through_launcher(tmp_path / "m", tmp_path)
    with torch.no_grad():
        want, got = model(_ids()).logits, again(_ids()).logits
    assert torch.equal(got, want), (arch, (got - want).abs().max().item())


@pytest.mark.parametrize("arch", ROWS)
def test_expanded_model_through_the_launcher_starts_at_the_base_loss(tmp_path, arch):
    base_dir = save_tiny(tmp_path / "base", arch=arch, num_layers=4)
    base = T.AutoModelForCausalLM.from_pretrained(base_dir).eval()
    with torch.no_grad():
        want = base(_ids(), labels=_ids()).loss.item()
    for _ in range(2):  # two loads of the cached expanded folder: the same function each time
        exp = _through_launcher(base_dir, tmp_path, "plan.name=expand", "plan.expand_blocks=2")
        assert len(exp.get_decoder().layers) == 6
        with torch.no_grad():
            got = exp(_ids(), labels=_ids()).loss.item()
        assert abs(got - want) <= 1e-6 * abs(want), (arch, got, want)


def test_gemma3_headed_hybrid_reloads_bitwise(tmp_path):
    gemma = save_tiny(tmp_path / "gemma3", "gemma3", 4, seed=1)
    llama = save_tiny(tmp_path / "llama", "llama", 4, seed=2)
    segs = [{"donor": gemma, "layers": [0, 2]}, {"donor": llama, "layers": [2, 4]}]
    model, tok = build_hybrid(plan_hybrid(segs, gemma))
    save_hybrid(model, tok, tmp_path / "hybrid")
    again = _through_launcher(tmp_path / "hybrid", tmp_path)
    assert float(non_persistent_buffers(again)["model.embed_tokens.embed_scale"]) == pytest.approx(32 ** 0.5)
    with torch.no_grad():
        assert torch.equal(again(_ids()).logits, model(_ids()).logits)


def test_restore_buffers_rewrites_a_damaged_buffer_and_names_it():
    model = tiny_model("gemma3", num_layers=2)
    bufs = non_persistent_buffers(model)
    assert float(bufs["model.embed_tokens.embed_scale"]) == pytest.approx(32 ** 0.5)  # sqrt(hidden), by hand
    bufs["model.embed_tokens.embed_scale"].fill_(1e24)
    bufs["model.rotary_emb.sliding_attention_inv_freq"].zero_()
    assert sorted(restore_buffers(model)) == ["model.embed_tokens.embed_scale",
                                              "model.rotary_emb.sliding_attention_inv_freq"]
    assert float(bufs["model.embed_tokens.embed_scale"]) == pytest.approx(32 ** 0.5)
    assert restore_buffers(model) == []

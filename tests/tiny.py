"""Tiny random models of every supported architecture, built from configs (no download).

Deterministic weights: each builder seeds torch before init (torchtune's ``fixed_init_model`` idea).
"""

from __future__ import annotations

import torch
import transformers as T

VOCAB = 128


def tiny_config(arch: str, num_layers: int = 4, hidden: int = 32, vocab: int = VOCAB):
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=num_layers)
    attn = dict(intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                max_position_embeddings=256)
    if arch == "llama":
        return T.LlamaConfig(**common, **attn, tie_word_embeddings=True)
    if arch == "qwen2":
        attn.pop("head_dim")
        return T.Qwen2Config(**common, **attn)
    if arch == "qwen3":
        return T.Qwen3Config(**common, **attn)
    if arch == "gemma3":
        return T.Gemma3TextConfig(**common, **attn, sliding_window=4)
    if arch == "mamba2":
        return T.Mamba2Config(**common, num_heads=4, head_dim=hidden // 2, state_size=8, n_groups=1, expand=2)
    if arch == "nemotron_h":
        kinds = (["linear_attention", "full_attention", "mlp"] * num_layers)[:num_layers]
        return T.NemotronHConfig(**common, **attn, mamba_num_heads=4, mamba_head_dim=hidden // 2, ssm_state_size=8,
                                 n_groups=1, layers_block_type=kinds)
    raise ValueError(arch)


ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "mamba2", "nemotron_h"]


def tiny_model(arch: str = "llama", num_layers: int = 4, hidden: int = 32, seed: int = 0):
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(tiny_config(arch, num_layers, hidden))
    return model.eval()


def tiny_tokenizer(vocab: int = VOCAB):
    """A character-level fast tokenizer (offsets work) with BOS/EOS, built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    chars = [chr(c) for c in range(32, 127)] + list("→，。：；")
    vocab_map = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for ch in chars:
        if len(vocab_map) >= vocab:
            break
        vocab_map.setdefault(ch, len(vocab_map))
    tok = Tokenizer(models.WordLevel(vocab=vocab_map, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                     unk_token="<unk>")
    return fast


def save_tiny(path, arch: str = "llama", num_layers: int = 4, hidden: int = 32, seed: int = 0):
    """Write a tiny model + tokenizer folder (safetensors), as a pulled model would look."""
    model = tiny_model(arch, num_layers, hidden, seed)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def prompt_sensitive_llama(seed: int, num_layers: int = 2, hidden: int = 32):
    """A tiny Llama whose matrices are redrawn with std 1 (seeded): a freshly initialised tiny model picks
    the same answer for every question, this one's choice depends on the prompt."""
    import torch

    model = tiny_model("llama", num_layers=num_layers, hidden=hidden, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g))
    return model

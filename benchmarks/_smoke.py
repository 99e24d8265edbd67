"""The smoke mode every benchmark has (``--smoke``): tiny sizes and a tiny random model, so the script runs
end to end in seconds. It checks that the benchmark still works (imports, the code path, its RESULT lines);
its numbers are not the claim. ``tests/unit/test_benchmarks_smoke.py`` runs every ``bench_*.py --smoke``.
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
from pathlib import Path

SMOKE_HELP = "tiny sizes and a tiny random model: runs in seconds (the test suite runs it); not the claim"


def add_smoke(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def tiny_model_dir(layers: int = 4, hidden: int = 64) -> str:
    """A tiny Llama (random weights, safetensors) with a character-level tokenizer, in a temporary folder
    removed at exit: what a pulled model folder looks like."""
    import torch
    import transformers as T
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    root = Path(tempfile.mkdtemp(prefix="raycpt-smoke-"))
    atexit.register(shutil.rmtree, root, True)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for c in range(32, 127):
        vocab.setdefault(chr(c), len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                              unk_token="<unk>").save_pretrained(root)
    conf = T.LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(0)
    T.AutoModelForCausalLM.from_config(conf).save_pretrained(root)
    return str(root)


def smoke(args: argparse.Namespace, **tiny) -> argparse.Namespace:
    """With ``--smoke``: the tiny sizes ``tiny`` (attribute -> value) and, when the benchmark takes
    ``--model``, the tiny model. Prints one line saying so."""
    if getattr(args, "smoke", False):
        for k, v in tiny.items():
            setattr(args, k, v)
        if hasattr(args, "model") and "model" not in tiny:
            args.model = tiny_model_dir()
        print(f"smoke mode: {', '.join(f'{k}={v}' for k, v in tiny.items())} (numbers are not the claim)", flush=True)
    return args

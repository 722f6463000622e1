"""The tiny GGUF writer (lsp_server/backends/tiny_gguf.py): a file llama.cpp loads, equal to tiny-random."""

import pytest

from lsp_server.backends.base import find_fim_tokens
from lsp_server.backends.tiny import tiny_random
from lsp_server.backends.tiny_gguf import write_tiny_gguf

PROMPTS = ["def fibonacci(n):\n", "class Stack:\n    def ", "    for i in range(10):\n        print(",
           "héllo wörld 🙂 12345 'll've <|fim_prefix|>x"]


def _fields(path):
    import gguf

    r = gguf.GGUFReader(str(path))
    tokens = [str(r.fields["tokenizer.ggml.tokens"].contents(i)) for i in range(len(r.fields["tokenizer.ggml.tokens"].data))]
    return r, tokens


def test_metadata_mirrors_the_tiny_model(tmp_path):
    lm = tiny_random()
    r, tokens = _fields(write_tiny_gguf(tmp_path / "t.gguf"))
    assert r.fields["general.architecture"].contents() == "qwen2"
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert {t: i for i, t in enumerate(tokens)} == lm.vocabulary()
    assert find_fim_tokens({t: i for i, t in enumerate(tokens)}) == lm.fim
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "output_norm.weight", "blk.1.attn_q.bias", "blk.0.ffn_down.weight"} <= names


def test_without_fim_and_other_architecture(tmp_path):
    _, tokens = _fields(write_tiny_gguf(tmp_path / "nofim.gguf", fim=False))
    assert find_fim_tokens({t: i for i, t in enumerate(tokens)}) is None
    r, _ = _fields(write_tiny_gguf(tmp_path / "arch.gguf", architecture="nonesuch"))
    assert r.fields["general.architecture"].contents() == "nonesuch"


def test_llama_cpp_loads_it_and_decodes_as_torch(tmp_path):
    """Same token ids from both tokenizers; same greedy tokens from both runtimes (float32 file)."""
    from lsp_server.backends.llama.library import problem

    if problem():
        pytest.skip(f"no llama.cpp library: {problem()}")
    from lsp_server.backends.llama.model import LlamaModel
    from lsp_server.backends.llama.vocab import GGUFVocab

    path = write_tiny_gguf(tmp_path / "t.gguf")
    llm = LlamaModel("t", "t", path, threads=1, slots=1, slot_tokens=256)
    vocab = GGUFVocab(path)
    lm = tiny_random()
    for text in PROMPTS:
        ids = lm.encode(text)
        assert vocab.tokenize(text) == ids
        cache, theirs = lm.new_cache(), llm.new_cache()
        logits = lm.forward(ids, cache, last=1)
        scores = llm.forward(ids, theirs, last=1)
        want, got = [], []
        for _ in range(16):
            want.append(int(logits[-1].argmax()))
            logits = lm.forward([want[-1]], cache, last=1)
            got.append(int(scores[-1].argmax()))
            scores = llm.forward([got[-1]], theirs, last=1)
        llm.release(theirs)
        assert got == want, text

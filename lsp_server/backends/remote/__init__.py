"""A remote inference engine: Ditto in front of a team's GPU server (docs/team.md).

The engine (vLLM, llama.cpp's llama-server, llama-cpp-python's server, Ollama) runs the
model, batches users and speculates on its own; Ditto keeps its editor-side parts
(prompts with snippets of the open buffers, type-through, newest-request-wins, ghost-text
stop rules, statistics; lsp_server/completion/completer.py). Here: the model spec, the local
tokenizer that sizes prompts, and `RemoteGenerator`, the generation step that streams a
completion over HTTP and closes the connection as soon as the suggestion has ended or the
request was cancelled or superseded, so the engine stops generating.

Spec: ``http[s]://HOST[:PORT]/PATH#NAME[&tokenizer=TOK][&engine=ENGINE]``

- PATH ending in ``/v1`` (or anything else): an OpenAI-compatible ``POST PATH/completions``
  with ``stream: true``; ending in ``/api``: Ollama's ``POST /api/generate`` with
  ``raw: true`` (its OpenAI endpoint would wrap the FIM prompt in a chat template);
- NAME: the served model's name, sent as ``model`` (optional for single-model engines);
- ``tokenizer``: where prompt budgets are counted (`load_tokenizer`): a packaged model
  (``qwen2.5-coder-0.5b``), a ``.gguf`` file (its vocabulary), ``ollama:NAME[:TAG]`` (the
  GGUF a local Ollama store holds, lsp_server/backends/ollama.py), a ``tokenizer.json``, a local
  model directory, or ``chars`` (an estimate, `CharTokenizer`); ``auto`` (the default)
  takes, for Ollama, the served model from a local Ollama store if it is there, else an
  installed packaged model of the family NAME names, else the estimate;
- ``engine``: ``openai`` (standard fields only), ``llama.cpp`` (adds
  ``repeat_penalty: 1``: llama-cpp-python's server defaults to 1.1, which is not greedy),
  ``vllm`` (adds ``skip_special_tokens: false`` so the FIM stop tokens reach the stop
  strings) or ``ollama`` (the default for ``/api``).

The fragment never leaves this machine (it is not part of an HTTP request). A URL with a
user name or password is refused: credentials go in the ``remote`` setting's headers,
which are never logged. Ditto connects to the spec's host and port only: no redirects, no
proxies from the environment.

Left out on purpose: LSP (the server shows the one-line `notice`), prompts and stop rules
(the Completer passes them in), forward passes (an engine does not expose them).
"""

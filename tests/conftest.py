"""Fixtures shared by several test modules."""

import os

# Thread checks on (lsp_server/lsp/threads.py): a method of the event loop's parts called on the model
# worker, or the other way round, raises. Set before the server's modules are imported, and inherited
# by every server a test starts.
os.environ.setdefault("DITTO_CHECK_THREADS", "1")
# The definitions resolver's process at the tests' own priority, not 19 below it (lsp_server/completion/
# definitions.py `resolver_nice`): beside a CPU-heavy job it would get about 1% of a core, and the tests
# that wait for its jobs would time out on a busy machine. tests/lsp/test_definitions_jobs.py checks
# that the level asked is the level the process runs at.
os.environ.setdefault("DITTO_DEFINITIONS_NICE", "0")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of many tiny passes: thread hand-offs would cost more than the arithmetic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

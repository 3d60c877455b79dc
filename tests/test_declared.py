"""The allocator settings a script sets for itself, read the way ``python train.py`` would apply them."""

from __future__ import annotations

import pytest

from oomlab.measure.declared import declared_alloc_conf

TOP = 'import os\nos.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"\nimport torch\n'


@pytest.mark.parametrize(
    "source, conf",
    [
        (TOP, "expandable_segments:True"),
        ('"""Doc."""\n' + TOP, "expandable_segments:True"),
        ('import os\nos.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")\n', "max_split_size_mb:128"),
        ('import os\nimport torch\nos.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"\n', "expandable_segments:True"),
        ("import torch\nx = 1\n", None),
        ('import os\ndevice = "cuda"\nos.environ["PYTORCH_CUDA_ALLOC_CONF"] = "a:1"\n', "a:1"),
        # After other code, CUDA may have started: the setting would come too late, so it does not count.
        ('import os, torch\nx = torch.zeros(1, device="cuda")\nos.environ["PYTORCH_CUDA_ALLOC_CONF"] = "a:1"\n', None),
        # Inside a function, or computed, it is not a literal the harness can read.
        ('import os\ndef f():\n    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "a:1"\n', None),
        ('import os\nos.environ["PYTORCH_CUDA_ALLOC_CONF"] = ":".join(["a", "1"])\n', None),
        ('import os\nos.environ["OTHER"] = "a:1"\n', None),
        ("def broken(:\n", None),
    ],
    ids=[
        "top",
        "after-docstring",
        "setdefault",
        "after-import-torch",
        "none",
        "after-a-constant",
        "too-late",
        "in-function",
        "computed",
        "other-var",
        "syntax",
    ],
)
def test_declared_alloc_conf(source, conf):
    assert declared_alloc_conf(source) == conf


def test_the_last_setting_before_code_wins():
    source = TOP + 'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:64"\n'
    assert declared_alloc_conf(source) == "max_split_size_mb:64"

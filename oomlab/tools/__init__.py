"""The three-step workflow as tools that work on any training script.

Each tool module has two halves:

- the *probe* (``start`` / ``finish``), which runs inside the fresh measuring
  process around the script, and writes ``<tool>.json`` and its artifacts into
  an output folder;
- the *analysis and drawing*, pure functions the parent process (and the tests)
  call on what the probe wrote.

``graders/_child.py`` loads a probe by name: ``oomlab.tools.<name>``.
"""

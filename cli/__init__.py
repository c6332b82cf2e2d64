"""The ``headwater`` command line: the composition root, the only package that imports every other.

One module per noun group (``registry``, ``events``, ``offline``, ``serve``, ...); :mod:`headwater.cli.main`
is the table of contents that registers them. No library code imports this package (an import-linter
contract in ``pyproject.toml`` checks it).
"""

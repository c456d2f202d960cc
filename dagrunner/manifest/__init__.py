"""The release manifest.

- ``load``: its records (``Manifest``, ``GateSpec``, ...) and the loader.
- ``settings``: the run-wide tables ``[sandbox]``, ``[executor]``, ``[integrate]``'s keys.
- ``text``: a manifest's TOML or JSON text to a dict, syntax errors coded.
- ``fields``: the typed converters of its keys.
- ``globs``: the glob language of ``inputs`` and ``protected``.
- ``schema``: its JSON Schema, generated from the loader (``python -m dagrunner.manifest.schema``).
"""

"""``dagrunner init``: a first manifest from the checks a project already configures.

- ``detect``: the project's files read (never run, never imported) into ``Check`` records:
  Python tool tables, tox, nox, pre-commit, package.json scripts, Makefile targets, Go, Rust.
- ``write``: the checks rendered as a commented manifest, validated, written only where no
  file is.
"""

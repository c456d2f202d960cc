"""``dagrunner init``: a first manifest from the checks a project already configures.

- ``checks``: the records passed on: ``Check``, ``Skipped``, ``Found``.
- ``readers``: the project's files read as hostile input (regular files inside the
  repository, bounded in size and depth).
- ``python``: Python tool tables (ruff, black, isort, mypy, pyright, codespell, pytest).
- ``sessions``: what a runner's session is (its concern, a task or a check, more than a tool).
- ``toxenvs``: tox envs from ``tox.ini``, ``[tool.tox]`` and ``tox.toml``.
- ``noxsessions``: nox sessions from ``noxfile.py``.
- ``ci``: what GitHub workflows run by name.
- ``hookgates``: pre-commit's own gate, and a gate in a hook's stead that checks exactly the
  hook's files (what the hook installs too).
- ``ecosystems``: ``package.json`` scripts (and what CI runs in every workspace),
  ``Makefile`` targets, Go, Rust.
- ``jsrunners``: a script's test runner (``node --test``, vitest, jest, mocha) with its
  JUnit reporter.
- ``venvs``: a venv that imports the project in place, as a seed.
- ``nodeseeds``: a lockfile's ``node_modules`` (every workspace's), as a seed.
- ``network``: the checks that need the network, and why.
- ``detect``: every source read, one check per concern, the rest skipped with why.
- ``write``: the checks rendered as a commented manifest, validated, written only where no
  file is.
"""

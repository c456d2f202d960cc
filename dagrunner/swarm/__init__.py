"""Workers, integrate and land as node kinds of a release-check DAG.

- ``nodes``: the node kinds.
- ``release``: ``release_check`` with every node kind plugged in.
"""

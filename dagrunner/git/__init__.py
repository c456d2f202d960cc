"""The one door to git, and what is built on it.

- ``command``: every git call (environment cleaned, formats and command-running keys pinned).
- ``drivers``: the merge drivers and filters a repository's config defines, turned off.
- ``merge``: commits made and merged as objects only (``commit-tree``, ``merge-tree``).
- ``repo``: the repository, its common git dir, the worktree and cache roots.
- ``statetree``: a worktree's full state as a tree, through a temporary index.
- ``diff``: a binary diff read by its structure (which paths it touches, how).
- ``link``: a linked worktree's ``.git`` file restored from git's registry.
- ``locks``: stale git lock files, found before any gate run.
- ``integrated``: whether a branch's work is on a target, by exactly the same bytes.
- ``guard``: what a gate changed in the tracked files of its tree, and putting them back.
"""

"""What a new worktree gets before it is handed out: the files ``.worktreeinclude`` names,
its dependency seeds (``seeds``), and the caller's ``--setup`` steps."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dagrunner.errors import DagrunnerError, ExitCode
from dagrunner.git.command import git
from dagrunner.manifest.load import DEFAULT_MANIFEST, STARTER_MANIFEST, Manifest, load_manifest
from dagrunner.process import share, toolcaches
from dagrunner.records.worktree import SeedUse
from dagrunner.worktrees import seeds

SETUP_TAIL_LINES = 20


def copy_included(main: Path, path: Path, skip: Sequence[str] = ()) -> list[str]:
    """Copy files that ``.worktreeinclude`` (gitignore syntax) names, never over a tracked
    file nor into a seed's folder (``skip``)."""
    spec_file = main / ".worktreeinclude"
    if not spec_file.is_file():
        return []
    import pathspec  # 0.02 s of imports (asyncio among them) that only this file needs

    spec = pathspec.GitIgnoreSpec.from_lines(spec_file.read_text().splitlines())
    candidates = git(["ls-files", "--others", "-z"], cwd=main).stdout.split(b"\0")
    tracked = set(git(["ls-files", "-z"], cwd=path).stdout.split(b"\0"))
    copied = []
    for raw in candidates:
        if not raw or raw in tracked:
            continue
        rel = raw.decode("utf-8", "surrogateescape")
        if not spec.match_file(rel) or any(rel == s or rel.startswith(f"{s}/") for s in skip):
            continue
        source, dest = main / rel, path / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            dest.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, dest)
        copied.append(rel)
    return copied


def provision_seeds(
    root: Path, wt_id: str, path: Path, built: Sequence[tuple[seeds.Seed, bool]], how: str
) -> tuple[SeedUse, ...]:
    """Each seed in the new worktree ``path`` (a clean checkout of the base)."""
    uses: list[SeedUse] = []
    for seed, fresh in built:
        for folder in seed.folders:  # its path, then the folders of its ``also``
            seeds.check_ignored(path, folder.path)
            layer = seeds.layer_of(root, wt_id, len(uses))
            uses.append(seeds.provision(seed, folder, path, how, layer, built=fresh))
            seeds.check_ignored(path, folder.path)  # placed: ignored here too
    return tuple(uses)


def remount_seeds(root: Path, wt_id: str, path: Path, uses: Sequence[SeedUse]) -> None:
    """The overlay seeds of a worktree whose mounts are gone (the machine restarted), back
    on their own layers."""
    for n, use in enumerate(uses):
        if use.how == "overlay":
            tree = seeds.stored_tree(root, use)
            if tree.is_dir():
                share.remount(tree, path, use.path, seeds.layer_of(root, wt_id, n))


def release_seeds(root: Path, path: Path) -> None:
    """Unmount the overlay seeds of a worktree about to be removed or pooled, and drop
    their layers."""
    layers = seeds.seeds_dir(root) / "layers"
    share.release(path, layers)
    toolcaches.drop_worktree(path)  # its gates' tool caches are nobody else's
    try:
        mine = layers / "+".join(path.relative_to(root).parts)
    except ValueError:
        return
    shutil.rmtree(mine, ignore_errors=True)


def run_setup(
    path: Path,
    setup: Sequence[str],
    timeout: float,
    env: Mapping[str, str],
    undo: Callable[[str], None],
) -> None:
    """Each ``--setup`` command in ``path``; the first that fails calls ``undo(command)``
    (which removes the worktree) and raises ``setup-failed``."""
    from dagrunner.process.command import Finished, run_command, without_git  # trio: only for setup

    for command in setup:
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            argv, finished = (
                [],
                Finished(exit_code=None, timed_out=False, error=str(exc), output=b""),
            )
        if argv:
            finished = run_command(argv, cwd=path, env=without_git(env), timeout=timeout)
        if finished.ok:
            continue
        output = finished.output.decode("utf-8", "replace")
        why = f"timed out after {timeout:g}s" if finished.timed_out else finished.why
        undo(command)
        tail = output.strip().splitlines()[-SETUP_TAIL_LINES:]
        raise DagrunnerError(
            "setup-failed",
            f"setup step {command!r} failed ({why}); the worktree was removed",
            exit_code=ExitCode.FAILED,
            details={"step": command, "output_tail": tail},
            hint="last output lines: " + (" | ".join(tail[-5:]) or "(none)"),
        )


def base_manifest(repo: Path, base: str) -> Manifest | None:
    """The manifest at ``base`` when it has a ``[worktrees]`` table (None otherwise)."""
    for rel in (DEFAULT_MANIFEST, STARTER_MANIFEST):
        shown = git(["show", f"{base}:{Path(rel).as_posix()}"], cwd=repo, check=False)
        if shown.returncode == 0:
            if b"worktrees" not in shown.stdout:  # most manifests: no parse on this path
                return None
            with tempfile.TemporaryDirectory(prefix="dagrunner-manifest-") as tmp:
                path = Path(tmp) / Path(rel).name
                path.write_bytes(shown.stdout)
                return load_manifest(path)
    return None

"""The records ``init`` passes from the readers to the writer: a check found, a check left
out (and why), and everything found in one project."""

from __future__ import annotations

from dataclasses import dataclass, field

WHOLE = ("**",)
# The programs that run a project's .pre-commit-config.yaml: pre-commit, and prek (a
# drop-in runner in Rust that reads the same file; pypa/packaging's lint session runs it).
HOOK_RUNNERS = ("pre-commit", "prek")


@dataclass(frozen=True, kw_only=True)
class Check:
    """One gate-to-be: what it runs, where it came from, what it reads."""

    id: str
    concern: str  # "python:lint", "js:tests", ... (one check per concern)
    run: tuple[str, ...]
    source: str  # where it was found, for the manifest's comment
    inputs: tuple[str, ...] = WHOLE  # WHOLE: any file it may read (any change runs it again)
    tools: tuple[str, ...] = ()
    estimate: str = "30s"
    memory: str = "256M"
    needs: tuple[str, ...] = ()
    note: str = ""  # a line of advice in the comment
    junit: str = ""  # the JUnit file it writes (relative to the root), if wired
    env_set: tuple[tuple[str, str], ...] = ()  # the gate's own `env.set`
    # What a runner's session (tox env, nox session, make target) runs, one command a tuple:
    # a session that does more than one tool gate is the project's own check and wins.
    commands: tuple[tuple[str, ...], ...] = ()
    runner: bool = False  # a tox env, nox session, script or target (not a tool table)
    program: str = ""  # what must be on PATH, when ``run`` starts with a shell
    python: str = ""  # the interpreter a tox env needs (python3.14), "" for any
    network: str = ""  # why it needs the network (written `network = "host"`, and said)
    # what to pip-install for it (a hook's pinned tool and additional_dependencies): said
    # in the install hint, as a venv seed's build installs them
    install: tuple[str, ...] = ()

    @property
    def needs_program(self) -> str:
        return self.program or self.run[0]


@dataclass(frozen=True, kw_only=True)
class Seed:
    """A ``[[worktrees.seed]]`` to be: a venv (``venvs``) or a package manager's
    ``node_modules`` (``nodeseeds``)."""

    path: str  # relative to the root
    key: tuple[str, ...]
    build: str
    ignored: bool  # the committed ignore rules cover the folder: the seed can be active
    note: str = ""  # what to know (distributions that cannot be pinned)
    tools: tuple[str, ...] = ("python3 --version",)
    also: tuple[str, ...] = ()  # more folders the build makes (each workspace's node_modules)
    store: str = ""  # the package manager's store that outlives the build
    why_off: str = ""  # written commented out, and why (besides the ignore rules)
    said: tuple[str, ...] = ()  # the comment above it


@dataclass(frozen=True)
class Skipped:
    id: str
    source: str
    why: str


@dataclass(frozen=True)
class Found:
    checks: tuple[Check, ...]
    skipped: tuple[Skipped, ...]
    languages: tuple[str, ...]
    env_pass: tuple[str, ...] = field(default=("PATH",))
    env_set: tuple[tuple[str, str], ...] = ()
    seeds: tuple[Seed, ...] = ()  # a venv that imports the project in place, node_modules
    # the project checks its commit messages (what says so): landed commits follow it
    convention: str = ""

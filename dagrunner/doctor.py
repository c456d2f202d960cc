"""Capability checks: what ``dagrunner doctor`` reports.

git and its version, the repository, worktree support, the gates' containment,
the worktree root (``repo.py`` checks and makes it) and free disk.  Every
check is a finding; ``doctor`` never raises for a failed one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from dagrunner.errors import DagrunnerError
from dagrunner.files import atomic_write
from dagrunner.git.command import git
from dagrunner.git.repo import LOW_DISK, MIN_GIT, git_version, repo_info, worktree_root
from dagrunner.process.prove import Proof, containment_key, proofs_file


@dataclass
class Finding:
    level: str  # PASS, WARN or FAIL
    check: str
    detail: str
    hint: str = ""

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "check": self.check, "detail": self.detail, "hint": self.hint}


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, level: str, check: str, detail: str, hint: str = "") -> None:
        self.findings.append(Finding(level, check, detail, hint))

    @property
    def ok(self) -> bool:
        return all(f.level != "FAIL" for f in self.findings)


def doctor(path: Path | None, env: Mapping[str, str] | None = None) -> Report:
    """Every check as a finding; never raises for a failed check."""
    env = os.environ if env is None else env
    report = Report()
    try:
        version = git_version()
    except DagrunnerError as exc:
        report.add("FAIL", "git", exc.message, exc.hint)
        return report
    text = ".".join(map(str, version))
    if version >= MIN_GIT:
        report.add("PASS", "git", f"git {text}")
    else:
        report.add("FAIL", "git", f"git {text} is older than 2.17", "upgrade git")
    try:
        info = repo_info(path)
    except DagrunnerError as exc:
        report.add("FAIL", "repository", exc.message, exc.hint)
        return report
    report.facts.update(
        repository=str(info.root), common_dir=str(info.common_dir), bare=info.bare, git=text
    )
    report.add("PASS", "repository", f"{info.root} (common git dir {info.common_dir})")
    report.add(
        "WARN" if info.bare else "PASS",
        "bare",
        "bare repository" if info.bare else "not bare",
        "worktrees of a bare repository have no main checkout to compare with" if info.bare else "",
    )
    listing = git(["worktree", "list", "--porcelain"], cwd=info.root, check=False)
    if listing.returncode == 0:
        count = listing.text.count("worktree ")
        report.add("PASS", "worktrees", f"supported ({count} registered)")
    else:
        report.add("FAIL", "worktrees", "git worktree is not usable here", "upgrade git")
    scopes = git(["config", "--list", "--show-scope"], cwd=info.root, check=False).text.split()
    outside = sorted({line.split("\t")[0] for line in scopes} & {"global", "system"})
    report.add(
        "FAIL" if outside else "PASS",
        "git-config",
        f"dagrunner's git reads {', '.join(outside)} config"
        if outside
        else "dagrunner's git reads the repository's config only (no global or system file); "
        "fsmonitor, hooks, ssh, askpass and credential helpers off",
        "report this: GIT_CONFIG_GLOBAL/GIT_CONFIG_SYSTEM were not honoured" if outside else "",
    )
    from dagrunner.process.cgroups import favors_dynmods
    from dagrunner.process.contain import detect

    contained = detect()
    report.facts["containment"] = contained.to_json()
    report.add(
        "PASS" if contained.pidns or contained.cgroup_kill else "WARN",
        "containment",
        f"{contained.mode}: {contained.describe()}",
        ""
        if contained.pidns or contained.cgroup_kill
        else "gates are held by their process group only; see dagrunner's docs/security.md "
        "(run as root, or enable user namespaces or cgroup delegation)",
    )
    from dagrunner.process import layers

    layered = layers.in_force()
    report.facts["gate_layers"] = layered
    report.add(
        "PASS" if layered else "NOTE",
        "gate layers",
        "each gate in an envelope's tree writes a layer of its own (an overlay): only the "
        "gates that need it see what it wrote"
        if layered
        else "gates in an envelope's tree share its untracked files: what one writes, the "
        "gates after it see (docs/security.md)",
        "" if layered else "run as root (overlay mounts), with gates' views, to layer them",
    )
    from dagrunner.process.contain import network_isolation

    isolating = network_isolation()
    report.facts["network_isolation"] = isolating
    report.add(
        "PASS" if isolating else "NOTE",
        "network",
        'gates with network = "isolated" get a network of their own (loopback only)'
        if isolating
        else 'no network namespace for gates here: a gate with network = "isolated" will not start',
        "" if isolating else "enable user namespaces (or run as root) to isolate gates' networks",
    )
    from dagrunner.process.observe import refused

    why = refused() or (
        "" if contained.bwrap and contained.views else "gates do not run under bubblewrap here"
    )
    observed = not why
    report.facts["reads_observed"] = observed
    report.add(
        "PASS" if observed else "NOTE",
        "observe",
        "reads observed: fanotify on each gate's own mount of its tree (bubblewrap)"
        if observed
        else f"reads not observed: {why}; whole-tree gates keyed by the whole tree",
        ""
        if observed
        else "run as root with bubblewrap installed to key each gate on the "
        'files it opened; see dagrunner\'s docs/cache.md, "Observed reads"',
    )
    if contained.views and not contained.bwrap:
        report.add(
            "NOTE",
            "bubblewrap",
            "gates' views are applied through a Python helper: about 15 ms of CPU more per "
            "gate than with bubblewrap",
            "install bubblewrap (Debian: apt-get install bubblewrap); see dagrunner's "
            "docs/security.md",
        )
    if contained.cgroup_kill is not None and favors_dynmods() is False:
        report.add(
            "NOTE",
            "cgroup-join",
            "cgroup v2 is mounted without favordynmods: a gate that starts after a quiet "
            "moment waits 5-17 ms for the kernel to let it join its cgroup",
            "for graphs of many short gates, an administrator can remount it: mount -o "
            "remount,favordynmods <the cgroup2 mount> (Linux >= 6.0; forks become slightly "
            "slower); see dagrunner's docs/benchmarks.md",
        )
    try:
        root = worktree_root(info, env)
    except DagrunnerError as exc:
        report.add("FAIL", "root", exc.message, exc.hint)
        return report
    report.facts["worktree_root"] = str(root)
    report.add("PASS", "root", f"{root}")
    free = shutil.disk_usage(root).free
    report.facts["free_bytes"] = free
    if free < LOW_DISK:
        report.add("WARN", "disk", f"{free >> 20} MiB free under the root", "free some space")
    else:
        report.add("PASS", "disk", f"{free >> 30} GiB free under the root")
    _check_seeds(report, root, env)
    _check_half_removed(report, info.state_dir)
    return report


def _check_half_removed(report: Report, state_dir: Path) -> None:
    """Worktrees a removal left half done (a folder without its ``.git``): no git command
    runs in them, and only ``worktree cleanup --force`` takes them away."""
    from dagrunner.worktrees.gone import half_removed
    from dagrunner.worktrees.ledger import Ledger

    broken = {
        wt_id: record.path
        for wt_id, record in sorted(Ledger(state_dir).state().items())
        if half_removed(Path(record.path))
    }
    if broken:
        report.add(
            "WARN",
            "half-removed",
            "worktree folder(s) without their .git (a removal cut short): "
            + ", ".join(f"{wt_id} at {path}" for wt_id, path in broken.items()),
            "dagrunner worktree cleanup ID --force removes each (an integrator that landed "
            "its work does it by itself)",
        )


def _check_seeds(report: Report, root: Path, env: Mapping[str, str]) -> None:
    """How dependency seeds ([[worktrees.seed]]) reach worktrees on this machine."""
    from dagrunner.process.share import choose
    from dagrunner.worktrees.seeds import seeds_dir

    try:
        how = choose(seeds_dir(root), env)
    except DagrunnerError as exc:
        report.add("FAIL", "seeds", exc.message, exc.hint)
        return
    report.facts["seed_share"] = how
    says = {
        "reflink": "reflinked (copy-on-write clones: shared until written)",
        "overlay": "an overlay mount per worktree (the stored seed read-only beneath)",
        "copy": "a plain copy per worktree (no reflinks, no overlay mounts here)",
    }
    report.add(
        "PASS" if how != "copy" else "NOTE",
        "seeds",
        f"seeds reach worktrees by {says[how]}",
        ""
        if how != "copy"
        else "a filesystem with reflinks (btrfs, XFS) or root for overlay "
        "mounts shares seeds' disk between worktrees",
    )


def check_cluster(report: Report, spec: str) -> None:
    """The cluster's workers: each one's resources, dagrunner and git versions (``--executor``)."""
    from dagrunner.executors.dask import DaskExecutor

    try:
        cluster = DaskExecutor(spec)
    except DagrunnerError as exc:
        report.add("FAIL", "cluster", exc.message, exc.hint)
        return
    try:
        workers = cluster.workers()
    finally:
        cluster.close()
    report.facts["workers"] = [
        {"address": w.address, "cpu": w.cpu, "memory": w.memory, "dagrunner": w.dagrunner,
         "git": w.git, "problem": w.problem}
        for w in workers
    ]  # fmt: skip
    if not workers:
        report.add("FAIL", "cluster", f"{cluster.address} has no workers", "start one")
    for w in workers:
        report.add(
            "FAIL" if w.problem else "PASS",
            "worker",
            f"{w.address}: cpu={w.cpu:g}, memory={w.memory >> 20} MiB, dagrunner "
            f"{w.dagrunner or '-'}, git {w.git or '-'}" + (f" -- {w.problem}" if w.problem else ""),
            "install the same dagrunner and git there" if w.problem else "",
        )


def prove_machine(env: Mapping[str, str] | None = None) -> Proof:
    """Run the sandbox's escape suite as a real gate (``process/prove``) and keep its verdict
    beside the caches, by containment, for ``run.json`` to say which suite held here."""
    from dagrunner.process.contain import detect, network_isolation
    from dagrunner.process.prove import prove

    env = os.environ if env is None else env
    found = detect()
    proof = prove(env, isolation=network_isolation(), containment=containment_key(found))
    path = proofs_file()
    with contextlib.suppress(OSError, ValueError):
        known = orjson.loads(path.read_bytes()) if path.is_file() else {}
        known = known if isinstance(known, dict) else {}
        summary = {k: v for k, v in proof.to_json().items() if k != "lines"}
        atomic_write(path, orjson.dumps({**known, proof.containment: summary}))
    return proof

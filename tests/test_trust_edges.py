"""Trust boundary II, items 7-12: the edges -- a dangling root, exports that submit would
refuse, a retry count without end, containment as an ordinary user, and files that change
how later work is judged.  Each on real repositories and processes, as the issue tried it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from conftest import CLI, commit_release_manifest, git, write_manifest
from test_integration import worker

from dagrunner.errors import DagrunnerError
from dagrunner.git.repo import repo_info
from dagrunner.integration.run import integrate
from dagrunner.integration.submit import submit
from dagrunner.manifest.load import load_manifest
from dagrunner.process.contain import bubblewrapped, namespaced
from dagrunner.process.view import View
from dagrunner.worktrees import allocate as wt
from dagrunner.worktrees import export as exporting


def cli(repo: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:  # type: ignore[type-arg]
    done = subprocess.run(
        [*CLI, *args, "--json"],
        cwd=repo,
        capture_output=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return done.returncode, orjson.loads(done.stdout)


# -- 7. a worktree root that is a dangling symlink -------------------------------------------


@pytest.mark.parametrize("command", [["worktree", "allocate", "--mission", "m", "--worker", "w"],
                                     ["worktree", "list"], ["doctor"]])  # fmt: skip
def test_a_dangling_root_is_a_coded_error_never_a_traceback(
    repo: Path, tmp_path: Path, command: list[str]
) -> None:
    root = tmp_path / "root-link"
    root.symlink_to(tmp_path / "gone")
    code, said = cli(repo, *command, env={"DAGRUNNER_WORKTREE_ROOT": str(root)})
    if command == ["doctor"]:
        assert code == 3 and any(
            "root-dangling" in f.get("detail", "") or "symbolic link" in f.get("detail", "")
            for f in said["findings"]
        ), said
    else:
        assert code == 3 and said["error"]["code"] == "root-dangling", said
        assert str(root) in said["error"]["message"]
    assert not (tmp_path / "gone").exists()  # nothing was made where the link points


# -- 8 and 11. export refuses what submit would refuse ---------------------------------------


def test_an_export_over_the_size_limit_is_refused_before_it_is_written(repo: Path) -> None:
    """The limit is checked as the diff is read: nothing over it is held or written."""
    path = Path(wt.allocate(mission="m", worker="big", repo=repo)["path"])
    (path / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    out = path.parent / "big.json"
    code, said = cli(
        repo, "worktree", "export", "m/big", "-o", str(out),
        env={"DAGRUNNER_ENVELOPE_MAX_BYTES": str(1024 * 1024)},
    )  # fmt: skip
    assert code == 2 and said["error"]["code"] == "envelope-too-large", said
    assert not out.exists()
    code, said = cli(repo, "worktree", "export", "m/big", "-o", str(out))  # the default limit
    assert code == 0 and out.exists()


def test_an_export_racing_the_worktrees_deletion_never_gives_what_submit_refuses(
    repo: Path,
) -> None:
    """Files vanish while export reads the worktree: each export either fails with a code or
    writes an envelope that submit accepts -- never an exit 0 with one it refuses."""
    path = Path(wt.allocate(mission="m", worker="racy", repo=repo)["path"])
    for attempt in range(12):
        folder = path / f"d{attempt}"
        folder.mkdir()
        for i in range(200):
            (folder / f"f{i}.txt").write_text(f"{attempt} {i}\n")
        remover = threading.Thread(
            target=shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True}
        )
        out = path.parent / f"racy{attempt}.json"
        remover.start()
        try:
            exporting.export("m/racy", output=out, repo=repo)
        except DagrunnerError as exc:
            assert exc.code.startswith(("envelope-", "export-", "git-failed")), exc.code
            continue
        finally:
            remover.join()
        submit(repo_info(repo), [out])  # raises (failing the test) if submit refuses it


# -- 9. a retry count without end -----------------------------------------------------------


def test_retries_beyond_a_handful_are_a_manifest_error(repo: Path) -> None:
    path = write_manifest(
        repo, '[gates.g]\nrun = "false"\nretries = 1000000000000000000000000000000\n'
    )
    with pytest.raises(DagrunnerError) as info:
        load_manifest(path)
    assert info.value.code == "manifest-value" and "retries" in str(info.value.to_json())
    ok = write_manifest(repo, '[gates.g]\nrun = "false"\nretries = 10\n', "ok.toml")
    assert load_manifest(ok).gates["g"].retries == 10


# -- 10. containment as an ordinary user -----------------------------------------------------


@pytest.fixture
def open_place() -> Iterator[Path]:
    """A folder an ordinary user can reach (pytest's own is its user's alone, and so is a
    gate's TMPDIR when the suite runs as a gate)."""
    place = Path(
        tempfile.mkdtemp(prefix="dagrunner-ordinary-", dir="/tmp")
    )  # not TMPDIR: a gate's is its own
    place.chmod(0o777)
    yield place
    shutil.rmtree(place, ignore_errors=True)


@pytest.mark.parametrize("way", ["unshare", "bubblewrap"])
def test_an_ordinary_user_gets_the_namespaces_and_the_allow_list(
    open_place: Path, way: str
) -> None:
    """The init and its view run as uid 65534 through a user namespace, as a CI runner's
    ordinary user would: a gate writes its tree, not the folder beside it, and sees nothing
    of the covered folder but what it may (the view applied either way)."""
    bwrap = shutil.which("bwrap") or ""
    if way == "bubblewrap" and not bwrap:
        pytest.skip("bubblewrap is not installed")
    python = sys.executable  # an ordinary user runs dagrunner with a Python of their own
    if os.geteuid() != 0:
        user: list[str] = []  # already an ordinary user
    elif shutil.which("setpriv") and os.access("/usr/bin/python3", os.X_OK):
        user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        python = "/usr/bin/python3"  # root's own may sit in root's home, out of its reach
    else:
        pytest.skip("needs setpriv and a system Python to become an ordinary user")
    place = open_place
    for name in ("cover/tree", "cover/secret", "beside", "stage"):
        (place / name).mkdir(parents=True)
    for folder in [place, *place.rglob("*")]:
        folder.chmod(0o777)
    view = View(
        writable=(place / "cover" / "tree",), stage=place / "stage", covers=(place / "cover",)
    )
    gate = (
        'touch "$1/tree/mine" && ! touch "$2/not-mine" 2>/dev/null && [ ! -e "$1/secret" ] '
        '&& [ "$(id -u)" = 0 ]'  # root only inside its own user namespace
    )
    command = ["/bin/sh", "-c", gate, "gate", str(place / "cover"), str(place / "beside")]
    left, tree = place / "cover" / "tree" / ".left", place / "cover" / "tree"
    if way == "bubblewrap":
        options = view.bwrap_options()
        argv = bubblewrapped(
            command, options=options, left=left, cwd=tree, bwrap=bwrap, userns=True
        )
    else:
        argv = namespaced(
            command, ops="\n".join(view.operations()), left=left, cwd=tree, userns=True,
            python=python,
        )  # fmt: skip
    done = subprocess.run([*user, *argv], capture_output=True, check=False)
    refused = (b"unshare" in done.stderr or b"bwrap" in done.stderr) and (
        b"Operation not permitted" in done.stderr or b"No permissions" in done.stderr
    )
    if refused:
        pytest.skip("this kernel gives ordinary users no user namespaces")
    assert done.returncode == 0, done.stderr.decode()
    made = place / "cover" / "tree" / "mine"
    assert made.exists() and made.stat().st_uid == (65534 if user else os.geteuid())
    assert not (place / "beside" / "not-mine").exists()


# -- 12. files that change how later work is judged ------------------------------------------

PROTECTING = """
[integrate]
protected = ["manifests/**", ".gitattributes", ".github/**"]

[gates.check]
run = "true"
"""


def test_a_protected_path_is_refused_unless_the_caller_allows_it(project: Path) -> None:
    commit_release_manifest(project, PROTECTING)
    union = worker(project, "union", lambda p: (p / ".gitattributes").write_text("* merge=union\n"))
    code, _ = cli(project, "integrate", "submit", str(union))
    assert code == 0
    result = integrate(repo=project, window=1)
    [outcome] = result.envelopes
    assert outcome.state == "rejected"
    assert (outcome.details.reason or "").startswith("protected-path") and ".gitattributes" in (
        outcome.details.reason or ""
    )
    assert git(project, "ls-tree", "--name-only", "main", ".gitattributes") == ""
    # the caller (trusted) lets it in: it lands, flagged as changing how work is judged
    again = worker(project, "again", lambda p: (p / ".gitattributes").write_text("* merge=union\n"))
    code, _ = cli(project, "integrate", "submit", str(again), "--allow-protected")
    assert code == 0
    result = integrate(repo=project, window=1)
    [landed] = result.envelopes
    assert landed.state == "landed" and landed.details.judging_changed == (".gitattributes",)
    page = (Path(result.report_dir) / "integration.json").read_text()
    assert "judging_changed" in page


def test_a_file_that_changes_how_work_is_judged_is_flagged_without_protection(
    project: Path,
) -> None:
    modules = worker(project, "mods", lambda p: (p / ".gitmodules").write_text("# none\n"))
    submit(repo_info(project), [modules])
    result = integrate(repo=project, window=1)
    [outcome] = result.envelopes
    assert outcome.state == "landed" and outcome.details.judging_changed == (".gitmodules",)
    assert "how later work is judged" in (outcome.details.note or "")

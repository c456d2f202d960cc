"""A failed gate's one line of why (issue 44): a program its tree lacks but the checkout's
``node_modules/.bin`` holds names the seed to add; a host it could not reach says the gate
needs the network -- on real gates in real release checks, and on the words of the common
tools (pip, npm, pnpm, yarn, git, sphinx's intersphinx, pre-commit)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dagrunner.cli.main import run_cli
from dagrunner.report.diagnose import diagnose, unreachable


def release_check(repo: Path, manifest: str, capsys: pytest.CaptureFixture[str]) -> str:
    (repo / "m.toml").write_text(manifest)
    code = run_cli(["release-check", str(repo / "m.toml"), "--repo", str(repo), "--no-cache"])
    out = capsys.readouterr()
    assert code == 1, out
    return out.out + out.err


def test_a_program_only_the_checkouts_node_modules_holds_names_the_seed_to_add(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = repo / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "faketsc").write_text("#!/bin/sh\necho compiled\n")
    os.chmod(bin_dir / "faketsc", 0o755)
    monkeypatch.chdir(repo)
    said = release_check(repo, '[gates.types]\nrun = "faketsc --noEmit"\n', capsys)
    line = next(line for line in said.splitlines() if line.startswith("--- types"))
    assert "command not found: faketsc" in line
    assert "`faketsc` is in node_modules/.bin of your checkout" in line
    assert "add a node_modules seed" in line


def test_a_gate_that_could_not_reach_its_host_says_so_in_one_line(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = '[gates.docs]\nrun = "git ls-remote https://docs.example.invalid/inv.git"\n'
    said = release_check(repo, manifest, capsys)
    line = next(line for line in said.splitlines() if line.startswith("--- docs"))
    assert "needs the network: could not reach docs.example.invalid" in line
    assert 'mark it network = "host"' in line


def test_a_gate_marked_as_needing_the_network_is_not_told_to_be_marked(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on real projects: the pre-commit gate init marked ``network = "host"`` still
    read "mark it network = "host" and run it online" offline."""
    manifest = (
        '[gates.docs]\nrun = "git ls-remote https://docs.example.invalid/inv.git"\n'
        'network = "host"  # it needs the network\n'
    )
    said = release_check(repo, manifest, capsys)
    line = next(line for line in said.splitlines() if line.startswith("--- docs"))
    assert "needs the network: could not reach docs.example.invalid" in line
    assert "mark it" not in line and "run it where the network is reachable" in line, line


def test_the_report_page_says_the_line_the_terminal_says(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on pypa/packaging: the terminal said "needs the network: could not reach
    packaging.python.org" of the docs gate; the run's index.html said only "exit code 1"."""
    manifest = '[gates.docs]\nrun = "git ls-remote https://docs.example.invalid/inv.git"\n'
    said = release_check(repo, manifest, capsys)
    page = Path(next(x for x in said.splitlines() if x.startswith("report: "))[len("report: ") :])
    failure = page.read_text().split('id="fail-docs"', 1)[1].split("</div>", 2)
    assert "needs the network: could not reach docs.example.invalid" in "".join(failure[:2])


@pytest.mark.parametrize(
    ("log", "host"),
    [
        (  # pip
            "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, "
            "status=None)) after connection broken by 'NewConnectionError('<pip._vendor."
            "urllib3.connection.HTTPSConnection object at 0x7f>: Failed to establish a new "
            "connection: [Errno -3] Temporary failure in name resolution')': /simple/attrs/\n"
            "ERROR: Could not find a version that satisfies the requirement attrs",
            "the network",
        ),
        (
            "pip._vendor.urllib3.exceptions.MaxRetryError: HTTPSConnectionPool(host='pypi.org',"
            " port=443): Max retries exceeded with url: /simple/attrs/ (Caused by "
            "NewConnectionError('Failed to establish a new connection: [Errno -3] Temporary "
            "failure in name resolution'))",
            "pypi.org",
        ),
        (  # npm
            "npm error code ENOTFOUND\nnpm error syscall getaddrinfo\nnpm error errno ENOTFOUND\n"
            "npm error network request to https://registry.npmjs.org/typescript failed, "
            "reason: getaddrinfo ENOTFOUND registry.npmjs.org",
            "registry.npmjs.org",
        ),
        (  # pnpm
            " ERR_PNPM_META_FETCH_FAIL  GET https://registry.npmjs.org/vitest: request to "
            "https://registry.npmjs.org/vitest failed, reason: getaddrinfo EAI_AGAIN "
            "registry.npmjs.org",
            "registry.npmjs.org",
        ),
        (  # sphinx's intersphinx
            "WARNING: failed to reach any of the inventories with the following issues:\n"
            "intersphinx inventory 'https://docs.python.org/3/objects.inv' not fetchable due "
            "to <class 'requests.exceptions.ConnectionError'>: HTTPSConnectionPool(host="
            "'docs.python.org', port=443): Max retries exceeded",
            "docs.python.org",
        ),
        (  # pre-commit cloning a hook repository
            "An unexpected error has occurred: CalledProcessError: command: ('/usr/bin/git', "
            "'fetch', 'origin', '--tags')\nreturn code: 128\nstderr:\n    fatal: unable to "
            "access 'https://github.com/pre-commit/pre-commit-hooks/': Could not resolve "
            "host: github.com",
            "github.com",
        ),
        ("curl: (6) Could not resolve host: example.org", "example.org"),
        ("FAILED tests/test_x.py::test_y - assert 1 == 2\n1 failed in 0.1s", ""),
    ],
)
def test_the_host_is_read_from_the_common_tools_words(log: str, host: str) -> None:
    assert unreachable(log) == host
    assert bool(diagnose(log, 1)) is bool(host)

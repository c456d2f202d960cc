"""Tool fingerprints remembered by identity: real tools, real runs, real pyenv-like shims."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson
import pytest
from conftest import check, gate_results

from dagrunner.engine.tools import command_identity
from dagrunner.git.repo import cache_root


def python_tool(folder: Path, name: str, counter: Path, version: str) -> Path:
    """An executable Python script (``#!`` this environment's Python) that counts its runs."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / name
    tool.write_text(
        f"#!{sys.executable}\n"
        f"with open({str(counter)!r}, 'a') as f: f.write('ran\\n')\n"
        f"print({version!r})\n"
    )
    tool.chmod(0o755)
    return tool


def manifest(bin_dir: Path, tool: str) -> str:
    return f"""
[env]
set = {{ PATH = "{bin_dir}:/usr/bin:/bin" }}

[sandbox]
writable = ["{bin_dir.parent}"]  # where the tool counts its runs

[gates.a]
run = ["true"]
inputs = ["README"]
tools = ["{tool}"]
"""


def runs(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_a_version_query_runs_again_only_when_its_executable_changes(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counter = tmp_path / "count"
    tool = python_tool(tmp_path / "bin", "mytool", counter, "mytool 1.0")
    body = manifest(tmp_path / "bin", "mytool --version")
    code, _, _ = check(capsys, repo, body)
    assert code == 0 and runs(counter) == 1
    code, _, second = check(capsys, repo, body)
    assert code == 0 and runs(counter) == 1  # remembered: not run again
    assert gate_results(second)["a"]["status"] == "cached"
    proof = gate_results(second)["a"]["cache"]
    assert proof["tools"]["mytool --version"].startswith("mytool 1.0")
    python_tool(tmp_path / "bin", "mytool", counter, "mytool 2.0")  # upgraded in place
    code, _, third = check(capsys, repo, body)
    assert code == 0 and runs(counter) == 2
    assert gate_results(third)["a"]["status"] != "cached"  # a new tool: a new key
    assert tool.exists()


def test_a_forged_memo_entry_is_not_believed(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counter = tmp_path / "count"
    python_tool(tmp_path / "bin", "mytool", counter, "mytool 1.0")
    body = manifest(tmp_path / "bin", "mytool --version")
    check(capsys, repo, body)
    (entry,) = (cache_root() / "tools").glob("*.json")
    stored = orjson.loads(entry.read_bytes())
    stored["body"]["digest"] = "0" * 64  # what a gate writing into the cache would try
    entry.write_bytes(orjson.dumps(stored))
    code, _, run_dir = check(capsys, repo, body)
    assert code == 0 and runs(counter) == 2  # not believed: the tool ran again
    assert gate_results(run_dir)["a"]["status"] == "cached"  # and its real output still hits


@pytest.mark.parametrize(
    "command",
    ["sh -c 'echo 1'", "cat README", "python -c 'print(1)'", "python -m pip install x", "true"],
)
def test_commands_whose_output_depends_on_more_are_never_remembered(command: str) -> None:
    env = {"PATH": os.environ["PATH"]}
    assert command_identity(command, env, Path.cwd()) is None


def test_a_modules_version_query_is_remembered_unless_the_folder_shadows_it(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    query = "python -m pytest --version"
    assert command_identity(query, env, tmp_path) is not None
    assert command_identity("python -m pytest tests", env, tmp_path) is None  # it runs tests
    (tmp_path / "pytest.py").write_text("print('a local pytest')\n")
    assert command_identity(query, env, tmp_path) is None  # python would run this one
    body = (
        f'[env]\nset = {{ PATH = "{env["PATH"]}" }}\n\n'
        f'[gates.a]\nrun = ["true"]\ninputs = ["README"]\ntools = ["{query}"]\n'
    )
    code, _, _ = check(capsys, repo, body)
    assert code == 0
    assert len(list((cache_root() / "tools").glob("*.json"))) == 1  # remembered: runs no pytest
    code, _, second = check(capsys, repo, body)
    assert code == 0 and gate_results(second)["a"]["status"] == "cached"
    assert gate_results(second)["a"]["cache"]["tools"][query].startswith("pytest ")


def test_a_virtualenvs_tool_is_remembered_until_its_packages_change(tmp_path: Path) -> None:
    import subprocess

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    tool = venv / "bin" / "vtool"
    tool.write_text(f"#!{venv / 'bin' / 'python'}\nprint('vtool 1')\n")
    tool.chmod(0o755)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    first = command_identity("vtool --version", env, tmp_path)
    assert first is not None and first == command_identity("vtool --version", env, tmp_path)
    assert command_identity("python -m vtool --version", env, tmp_path) is not None
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "newdist-1.0.dist-info").mkdir()  # a package installed into the venv
    assert command_identity("vtool --version", env, tmp_path) not in (None, first)
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(
        cfg.read_text().replace(
            "include-system-site-packages = false", "include-system-site-packages = true"
        )
    )
    assert command_identity("vtool --version", env, tmp_path) is None  # sees the system's too


def test_a_python_path_in_the_gate_environment_is_never_remembered(tmp_path: Path) -> None:
    python_tool(tmp_path / "bin", "mytool", tmp_path / "count", "1")
    env = {"PATH": str(tmp_path / "bin")}
    assert command_identity("mytool --version", env, tmp_path) is not None
    assert command_identity("mytool --version", {**env, "PYTHONPATH": "/x"}, tmp_path) is None


def test_a_shell_script_tool_is_never_remembered(tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "shtool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho 1\n")
    tool.chmod(0o755)
    assert command_identity("shtool --version", {"PATH": str(tool.parent)}, tmp_path) is None


def test_a_pyenv_shim_is_followed_to_the_version_it_selects(tmp_path: Path) -> None:
    root = tmp_path / "pyenv"
    shim = root / "shims" / "mytool"
    shim.parent.mkdir(parents=True)
    shim.write_text('#!/usr/bin/env bash\nexec "/x/libexec/pyenv" exec "mytool" "$@"\n')
    shim.chmod(0o755)
    for version in ("1.0", "2.0"):
        python_tool(root / "versions" / version / "bin", "mytool", tmp_path / "c", version)
    env = {"PATH": str(root / "shims")}
    project = tmp_path / "project"
    project.mkdir()
    assert command_identity("mytool --version", env, project) is None  # "system": unknown
    (root / "version").write_text("1.0\n")
    one = command_identity("mytool --version", env, project)
    (root / "version").write_text("2.0\n")
    two = command_identity("mytool --version", env, project)
    (project / ".python-version").write_text("1.0\n")  # a local choice wins over the global
    local = command_identity("mytool --version", env, project)
    chosen = command_identity("mytool --version", {**env, "PYENV_VERSION": "2.0"}, project)
    assert None not in (one, two, local, chosen)
    assert len({one, two, local, chosen}) == 4  # where the choice came from is part of it
    (root / "versions" / "2.0" / "bin" / "mytool").write_text("#!/bin/sh\n")
    assert command_identity("mytool --version", {**env, "PYENV_VERSION": "2.0"}, project) is None


def test_an_envelopes_tree_never_answers_from_remembered_tools(
    project: Path, tmp_path: Path
) -> None:
    """In an integration, the tools' cwd is the envelope's tree: a ``pip/`` it adds is what
    ``python -m pip`` runs.  There the tool runs every time, and nothing is remembered."""
    from conftest import git as run_git
    from test_integration import states, worker

    from dagrunner.git.repo import repo_info
    from dagrunner.integration.run import integrate
    from dagrunner.integration.submit import submit

    def shadow(path: Path) -> None:
        (path / "pip").mkdir()
        (path / "pip" / "__init__.py").write_text("")
        (path / "pip" / "__main__.py").write_text("print('pip 0.0 (planted by the envelope)')\n")

    manifest = tmp_path / "tools.toml"
    manifest.write_text(
        f'[env]\nset = {{ PATH = "{Path(sys.executable).parent}:/usr/bin:/bin" }}\n\n'
        '[gates.check]\nrun = "true"\ninputs = ["*.txt"]\n'
        'tools = ["python -m pip freeze --all"]\n'
    )
    run_git(project, "commit", "-q", "--allow-empty", "-m", "nothing")
    submit(repo_info(project), [worker(project, "w1", shadow)])
    result = integrate(repo=project, manifest=manifest, window=1)
    assert result.ok and states(project) == {"w1": "landed"}
    assert not (cache_root() / "tools").exists()  # nothing remembered from an envelope's tree
    run_dir = next(Path(result.report_dir).glob("gates-*"))
    proof = gate_results(run_dir)["check"]["cache"]
    assert "planted by the envelope" in proof["tools"]["python -m pip freeze --all"]


def test_a_node_scripts_version_query_is_remembered_until_its_package_changes(
    tmp_path: Path,
) -> None:
    """``npm --version`` ran on every run, a fully cached one too (0.14 s): a node script's
    output follows from the script, node and its package's package.json."""
    bin_dir, package = tmp_path / "bin", tmp_path / "lib" / "node_modules" / "npm"
    bin_dir.mkdir()
    (package / "bin").mkdir(parents=True)
    node = bin_dir / "node"
    node.write_bytes(Path("/bin/true").read_bytes())  # a binary named node
    node.chmod(0o755)
    script = package / "bin" / "npm-cli.js"
    script.write_text("#!/usr/bin/env node\nconsole.log('10.0.0')\n")
    script.chmod(0o755)
    (package / "package.json").write_text('{"version": "10.0.0"}')
    (bin_dir / "npm").symlink_to(script)
    env = {"PATH": str(bin_dir)}
    first = command_identity("npm --version", env, tmp_path)
    assert first is not None and first == command_identity("npm --version", env, tmp_path)
    os.utime(package / "package.json", ns=(1, 1))  # an upgrade rewrites it
    assert command_identity("npm --version", env, tmp_path) not in (None, first)
    (package / "package.json").unlink()  # a script in no package: never remembered
    assert command_identity("npm --version", env, tmp_path) is None

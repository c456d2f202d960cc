"""Soak and chaos test of ``integrate serve`` (issue 48): one repository, a cheap gate, so the
queue itself is measured.

    python scripts/soak_serve.py --envelopes 60 --cli 4 --mcp 4 --chaos 3
    python scripts/soak_serve.py --envelopes 60 --waiters 10 --history 10000   # starvation

Phases: N envelopes are made (a worktree each, one new file, exported); ``--history L`` first
appends L journal lines of old final items (the long journal of a swarm's past).  Then
``integrate serve --http`` starts in a process group of its own and the envelopes are
submitted: by C CLI submitters (``integrate submit``) and M MCP clients (``dagrunner_submit``
inline over ``/mcp``, then ``dagrunner_wait`` until final).  ``--waiters W``: all envelopes
are queued first, then W MCP clients wait on them while serve drains (throughput with
waiters, against ``--waiters 0``).  ``--chaos K``: K group SIGKILLs at random moments and a
group SIGTERM, serve restarted after each.  At the end it verifies 0 lost (every envelope's
item final, each landed one's file on the target), 0 duplicated (no envelope in two commits),
0 stuck (nothing pending), ``worktree list`` working and no worktree of a landed item left;
then it runs ``integrate prune --keep 0s`` and times status, stats and a submit against the
same on an empty queue (a repository made the same way, timed turn about with it).  Prints items/min, serve's peak RSS (its own process, as the issue's line counts it), its drain
child's and both together, and the state's disk growth.
Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "dagrunner"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
GIT_ID = {"GIT_AUTHOR_NAME": "s", "GIT_AUTHOR_EMAIL": "s@s", "GIT_COMMITTER_NAME": "s",
          "GIT_COMMITTER_EMAIL": "s@s"}  # fmt: skip


def run(*args: str, repo: Path, check: bool = True) -> Any:
    done = subprocess.run([*CLI, *args, "--repo", str(repo), "--json"], capture_output=True,
                          env=ENV, check=False)  # fmt: skip
    if check and done.returncode != 0:
        raise SystemExit(f"{args} failed ({done.returncode}): {done.stdout!r} {done.stderr!r}")
    return orjson.loads(done.stdout) if done.stdout.strip() else None


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env={**os.environ, **GIT_ID}, check=True,
                          capture_output=True, text=True).stdout  # fmt: skip


def make_repo(base: Path) -> Path:
    repo = base / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "manifests").mkdir()
    (repo / "manifests" / "release.toml").write_text('[gates.ok]\nrun = "true"\n')
    (repo / ".gitignore").write_text("reports/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    return repo


def make_envelopes(repo: Path, count: int) -> list[Path]:
    sys.path.insert(0, str(ROOT))
    from dagrunner.worktrees import allocate as wt
    from dagrunner.worktrees import export as exporting

    made = []
    for n in range(count):
        path = Path(wt.allocate(mission="soak", worker=f"w{n}", repo=repo)["path"])
        (path / f"w{n}.txt").write_text(f"{n}\n")
        out = path.parent / f"w{n}.envelope.json"
        exporting.export(f"soak/w{n}", output=out, repo=repo)
        made.append(out)
    return made


def add_history(repo: Path, lines: int) -> None:
    """``lines`` journal lines of old final items (what a swarm's past leaves)."""
    sys.path.insert(0, str(ROOT))
    from dagrunner.git.repo import repo_info
    from dagrunner.integration.queue import Queue

    journal = Queue.of(repo_info(repo)).journal
    journal.parent.mkdir(parents=True, exist_ok=True)
    states = ["queued", "applying", "applied", "gating", "landing", "landed"]
    out: list[bytes] = []
    n = 0
    while len(out) < lines:
        for state in states:
            out.append(orjson.dumps({"at": "2025-01-01T00:00:00+00:00", "id": f"old.h{n}.0",
                                     "state": state, "target": "main", "mission": "old",
                                     "worker": f"h{n}", "note": "x" * 120}))  # fmt: skip
        n += 1
    with journal.open("ab") as handle:
        handle.write(b"\n".join(out) + b"\n")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """``integrate serve --http`` in its own process group; its peak RSS sampled."""

    def __init__(self, repo: Path, port: int, token: Path) -> None:
        self.repo, self.port, self.token = repo, port, token
        self.process: subprocess.Popen[bytes] | None = None
        self.peak_rss = 0  # serve's own process
        self.peak_child = 0  # its drain child (serve runs each drain in a process of its own)
        self.peak_total = 0  # serve and its drain child at one sample (libraries counted twice)
        self.lock = threading.Lock()
        self.done = False
        threading.Thread(target=self.sample, daemon=True).start()

    def start(self) -> None:
        command = [*CLI, "integrate", "serve", "--repo", str(self.repo), "--http",
                   f"127.0.0.1:{self.port}", "--token-file", str(self.token)]  # fmt: skip
        with self.lock:
            self.process = subprocess.Popen(
                command,
                env=ENV,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):  # never leave it running behind us
            os.killpg(self.process.pid, signal.SIGKILL)
        raise SystemExit("serve did not come up")

    def signal(self, sig: signal.Signals) -> int | None:
        with self.lock:
            assert self.process is not None
            os.killpg(self.process.pid, sig)
            try:
                return self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                return self.process.wait()

    def sample(self) -> None:
        while not self.done:
            with self.lock:
                pid = self.process.pid if self.process and self.process.poll() is None else None
            if pid is not None:
                with contextlib.suppress(psutil.Error):
                    serve = psutil.Process(pid)
                    own = serve.memory_info().rss
                    self.peak_rss = max(self.peak_rss, own)
                    # the drain, not a git a waiter's thread is forking (until it execs, a
                    # forked child shows its parent's whole RSS)
                    children = []
                    for child in serve.children():
                        with contextlib.suppress(psutil.Error):
                            if "dagrunner.agents.drain" in " ".join(child.cmdline()):
                                children.append(child.memory_info().rss)
                    self.peak_child = max([self.peak_child, *children])
                    self.peak_total = max(self.peak_total, own + sum(children))
            time.sleep(0.2)


def mcp_client(base: str, token: str, inline: list[str], wait_on: list[str],
               said: dict[str, str], errors: list[str]) -> None:  # fmt: skip
    """Submit each inline envelope, then wait on it (and on ``wait_on``) until final,
    reconnecting when the server went away."""
    import anyio
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    todo = list(inline)
    waiting: dict[str, int] = dict.fromkeys(wait_on, 0)

    async def session_once() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=70) as client,
            streamable_http_client(f"{base}/mcp", http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            while todo:
                answer = await session.call_tool("dagrunner_submit", {"envelope": todo[0]})
                body = answer.structured_content or {}
                if answer.is_error or "id" not in body:
                    raise RuntimeError(f"submit: {answer.content}")
                waiting.setdefault(body["id"], 0)
                todo.pop(0)
            while waiting:
                item, cursor = next(iter(waiting.items()))
                answer = await session.call_tool(
                    "dagrunner_wait", {"id": item, "timeout_seconds": 20, "cursor": cursor}
                )
                body = answer.structured_content or {}
                if answer.is_error:
                    raise RuntimeError(f"wait: {answer.content}")
                if body.get("final"):
                    said[item] = body["state"]
                    del waiting[item]
                else:
                    waiting[item] = body.get("cursor", cursor)

    for _ in range(200):
        try:
            anyio.run(session_once)
            return
        except Exception as exc:  # the server was killed: reconnect
            errors.append(type(exc).__name__)
            time.sleep(1)


def size_of(*folders: Path) -> int:
    total = 0
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


def timed_pair(one: Path, other: Path, args: list[str], other_args: list[str] | None = None,
               times: int = 7) -> tuple[float, float]:  # fmt: skip
    """The best of ``times`` runs of each, turn about (a submit: of an envelope queued
    already, so every run is the same duplicate)."""
    best = [float("inf"), float("inf")]
    for _ in range(times):
        for n, (repo, said) in enumerate(((one, args), (other, other_args or args))):
            began = time.perf_counter()
            run(*said, repo=repo)
            best[n] = min(best[n], time.perf_counter() - began)
    return best[0], best[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envelopes", type=int, default=60)
    parser.add_argument("--cli", type=int, default=4, help="CLI submitters")
    parser.add_argument("--mcp", type=int, default=0, help="MCP clients submitting inline")
    parser.add_argument("--waiters", type=int, default=0, help="MCP clients waiting only")
    parser.add_argument("--chaos", type=int, default=0, help="group SIGKILLs (then a SIGTERM)")
    parser.add_argument("--history", type=int, default=0, help="old journal lines first")
    parser.add_argument("--seed", type=int, default=48)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="soak-"))
    os.environ["DAGRUNNER_WORKTREE_ROOT"] = ENV["DAGRUNNER_WORKTREE_ROOT"] = str(base / "wt")
    os.environ["XDG_CACHE_HOME"] = ENV["XDG_CACHE_HOME"] = str(base / "cache")
    repo = make_repo(base)
    print(f"soak in {base}: {args}", flush=True)
    envelopes = make_envelopes(repo, args.envelopes + 2)
    probe_empty, probe_after = envelopes.pop(), envelopes.pop()
    probe = run("integrate", "submit", str(probe_empty), repo=repo)["submitted"][0]["id"]
    run("integrate", "run", repo=repo)
    if args.history:
        add_history(repo, args.history)
    state = repo / ".git" / "dagrunner"
    disk0 = size_of(state)
    token = base / "token"
    token.write_text("soak-token\n")
    port = free_port()
    server = Server(repo, port, token)
    said: dict[str, str] = {}
    errors: list[str] = []
    threads: list[threading.Thread] = []
    inline_count = args.envelopes * args.mcp // max(1, args.mcp + args.cli) if args.mcp else 0
    inline, by_cli = envelopes[:inline_count], envelopes[inline_count:]
    if args.waiters or not (args.cli or args.mcp):  # all queued first: the drain is measured
        run("integrate", "submit", *map(str, envelopes), repo=repo)
        ids = [e["id"] for e in run("integrate", "status", repo=repo)["envelopes"]
               if e["state"] == "queued"]  # fmt: skip
        by_cli, inline = [], []
    server.start()
    started = time.perf_counter()
    for n in range(args.cli):
        share = by_cli[n :: args.cli]

        def submit_share(share: list[Path] = share) -> None:
            for path in share:
                for _ in range(60):
                    done = subprocess.run([*CLI, "integrate", "submit", str(path), "--repo",
                                           str(repo), "--json"], env=ENV, capture_output=True)  # fmt: skip
                    if done.returncode == 0:
                        break
                    time.sleep(0.5)

        threads.append(threading.Thread(target=submit_share))
    url = f"http://127.0.0.1:{port}"
    for n in range(args.mcp):
        texts = [p.read_text() for p in inline[n :: args.mcp]]
        threads.append(threading.Thread(target=mcp_client,
                                        args=(url, "soak-token", texts, [], said, errors)))  # fmt: skip
    for n in range(args.waiters):
        threads.append(threading.Thread(target=mcp_client,
                                        args=(url, "soak-token", [], ids[n :: args.waiters],
                                              said, errors)))  # fmt: skip
    for thread in threads:
        thread.start()
    kills = 0

    def pending() -> int:
        body = run("integrate", "status", repo=repo)
        return sum(1 for e in body["envelopes"] if e["state"] not in
                   ("landed", "conflict", "gates-failed", "rejected"))  # fmt: skip

    while kills < args.chaos:
        time.sleep(rng.uniform(1.0, 6.0))
        server.signal(signal.SIGKILL)
        kills += 1
        server.start()
    if args.chaos:
        time.sleep(rng.uniform(0.5, 3.0))
        code = server.signal(signal.SIGTERM)
        print(f"group SIGTERM: serve exited {code}", flush=True)
        server.start()
    for thread in threads:
        thread.join()
    deadline = time.monotonic() + 600
    while pending() and time.monotonic() < deadline:
        time.sleep(0.5)
    drained = time.perf_counter() - started
    server.signal(signal.SIGTERM)
    server.done = True
    # -- verification ----------------------------------------------------------------------
    status = run("integrate", "status", repo=repo)["envelopes"]
    items = [e for e in status if e.get("mission") == "soak" and e["id"] != probe]
    final = ("landed", "conflict", "gates-failed", "rejected")
    stuck = [e["id"] for e in items if e["state"] not in final]
    workers = {e["worker"] for e in items}
    # an item naming no mission is nobody's: the soak would count its envelope lost
    nameless = [e["id"] for e in status if not e.get("mission")]
    lost = [p.stem.split(".")[0] for p in envelopes if p.stem.split(".")[0] not in workers]
    trailers = git(repo, "log", "--format=%(trailers:key=Dagrunner-Envelope,valueonly)", "main")
    ids = [line.strip() for line in trailers.splitlines() if line.strip()]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    landed = [e for e in items if e["state"] == "landed"]
    missing_files = [e["worker"] for e in landed
                     if subprocess.run(["git", "cat-file", "-e", f"main:{e['worker']}.txt"],
                                       cwd=repo, capture_output=True).returncode != 0]  # fmt: skip
    listed = subprocess.run([*CLI, "worktree", "list", "--repo", str(repo), "--json"], env=ENV,
                            capture_output=True)  # fmt: skip
    left = [w["id"] for w in orjson.loads(listed.stdout)["worktrees"]
            if w["id"].split("/")[-1] in {e["worker"] for e in landed}] if listed.returncode == 0 else ["?"]  # fmt: skip
    disk1 = size_of(state)
    n_landed = len(landed)
    print(f"items: {len(items)} ({n_landed} landed); {kills} group SIGKILLs; "
          f"MCP reconnects {len(errors)}", flush=True)  # fmt: skip
    print(f"items/min: {60 * len(items) / drained:.1f} ({drained:.1f}s from serve's start)")
    print(f"serve peak RSS: {server.peak_rss / 2**20:.1f} MiB")
    print(f"drain child peak RSS: {server.peak_child / 2**20:.1f} MiB; serve and its drain "
          f"together at most {server.peak_total / 2**20:.1f} MiB")  # fmt: skip
    print(
        f"state growth: {(disk1 - disk0) / 1024:.0f} KiB ({(disk1 - disk0) / max(1, len(items)):.0f} B per item)"
    )
    journal = state / "queue" / "journal.jsonl"
    lines = journal.read_bytes().count(b"\n")
    print(f"journal: {journal.stat().st_size} bytes, {lines} lines")
    shutil.copyfile(journal, base / "journal.before-prune.jsonl")  # what a finding is read in
    # -- prune, then the reads a client makes --------------------------------------------
    pruned = run("integrate", "prune", "--keep", "0s", repo=repo)
    run("integrate", "submit", str(probe_after), repo=repo)
    # the empty queue: a repository made the same way, one envelope landed and one queued,
    # timed turn about with this one (the machine's load moves; both see the same)
    empty = make_repo(base / "empty")
    first, queued = make_envelopes(empty, 2)
    run("integrate", "submit", str(first), repo=empty)
    run("integrate", "run", repo=empty)
    run("integrate", "submit", str(queued), repo=empty)
    t_status1, t_status0 = timed_pair(repo, empty, ["integrate", "status"])
    t_stats1, t_stats0 = timed_pair(repo, empty, ["integrate", "stats"])
    t_submit1, t_submit0 = timed_pair(repo, empty, ["integrate", "submit", str(probe_after)],
                                      ["integrate", "submit", str(queued)])  # fmt: skip
    print(
        f"prune: {pruned['items']} items, journal {pruned['journal_bytes']} bytes, ledger "
        f"{pruned['ledger_bytes']} bytes, {pruned['notes_removed']} landed proofs removed; "
        f"state now {size_of(state) / 1024:.0f} KiB"
    )
    print(
        f"after prune vs empty queue: status {t_status1:.3f}s/{t_status0:.3f}s "
        f"({t_status1 / t_status0:.2f}x), stats {t_stats1:.3f}s/{t_stats0:.3f}s "
        f"({t_stats1 / t_stats0:.2f}x), submit {t_submit1:.3f}s/{t_submit0:.3f}s "
        f"({t_submit1 / t_submit0:.2f}x)"
    )
    problems = {"lost": lost, "duplicated": duplicated, "stuck": stuck,
                "landed without its file": missing_files, "worktrees of landed items left": left,
                "items naming no mission": nameless}  # fmt: skip
    if listed.returncode != 0:
        problems["worktree list failed"] = [listed.stderr.decode()[-300:]]
    bad = {k: v for k, v in problems.items() if v}
    print("checks:", bad if bad else "all hold (0 lost, 0 duplicated, 0 stuck)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

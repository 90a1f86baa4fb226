"""Basic auth under attack: what failed logins cost, and a valid login behind a flood.

``l9gpu serve --backend simulated --web-config`` with three users whose bcrypt hashes
have costs 5 (``htpasswd -B``'s default), 10 and 12. Reported:

* the median time of a failed login (wrong password) for each user and for an unknown
  one, ``--tries`` interleaved attempts each: they should not tell which users exist;
* with ``--flood`` concurrent wrong-password requests from one address (127.0.0.3), the
  time a valid login not cached yet takes from another address (127.0.0.2), and how the
  flood's requests were answered (401 checked, 503 refused at once).

Run: ``python benchmarks/bench_auth.py`` (about a minute); ``--tree DIR`` runs another
checkout's agent. Figures are recorded in docs/SECURITY.md ("Measured").
"""

from __future__ import annotations

import argparse
import base64
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import bcrypt

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from processes import free_port  # noqa: E402


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def get(port: int, source: str, headers: dict[str, str]) -> tuple[int, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120, source_address=(source, 0))
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - started
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=15)
    parser.add_argument("--flood", type=int, default=300)
    parser.add_argument("--tree", default=str(REPO))
    args = parser.parse_args(argv)
    users = {"c5": 5, "c10": 10, "c12": 12}
    with tempfile.TemporaryDirectory(prefix="l9gpu-bench-auth-") as tmp:
        config = Path(tmp) / "web.yml"
        config.write_text("basic_auth_users:\n" + "".join(
            f"  {u}: {bcrypt.hashpw(b'right', bcrypt.gensalt(c)).decode()}\n" for u, c in users.items()))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("L9GPU_", "OTEL_"))}
        env["PYTHONPATH"] = args.tree
        agent = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--backend", "simulated", "--listen",
                                  f"127.0.0.1:{port}", "--web-config", str(config)], cwd=args.tree, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    get(port, "127.0.0.1", {})
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit("the agent did not start") from None
                    time.sleep(0.1)
            times: dict[str, list[float]] = {u: [] for u in (*users, "unknown")}
            for _ in range(args.tries):
                for user in times:
                    status, took = get(port, "127.0.0.1", basic(user, "wrong"))
                    assert status == 401, status
                    times[user].append(took * 1e3)
            print("failed login, median ms: " + ", ".join(
                f"{u} (cost {users[u]}) {statistics.median(t):.1f}" if u in users else
                f"unknown user {statistics.median(t):.1f}" for u, t in times.items()))

            answers: Counter[int] = Counter()
            stop = threading.Event()

            def attack() -> None:
                while not stop.is_set():
                    try:
                        answers[get(port, "127.0.0.3", basic("c10", "wrong"))[0]] += 1
                    except OSError:
                        answers[0] += 1

            threads = [threading.Thread(target=attack, daemon=True) for _ in range(args.flood)]
            for thread in threads:
                thread.start()
            time.sleep(3.0)  # the flood under way
            status, took = get(port, "127.0.0.2", basic("c10", "right"))
            stop.set()
            for thread in threads:
                thread.join(120)
            print(f"{args.flood} concurrent wrong passwords: a valid login not cached yet answered {status} after "
                  f"{took:.2f}s; the flood's answers {dict(answers)}")
        finally:
            agent.terminate()
            agent.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

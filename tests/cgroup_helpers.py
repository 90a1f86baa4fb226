"""Real cgroups for tests: a throwaway tree under the cgroup2 mount, and pod identities.

Tests that put real processes into Kubernetes- or Slurm-shaped cgroups share these:
`cgroup2_unwritable` says why a test must skip (not root, no cgroup2 at
/sys/fs/cgroup/unified, not writable), `Cgroups` creates cgroups inside one parent named
for the test run (so a real node's hierarchy is never touched) and `cleanup` removes all
of it, even after a failure; `pod_uid`, `container_id` and `kubeconfig` give the
identities and client configuration the fake API server (fakes.kubernetes_apiserver) needs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Protocol

UNIFIED = Path("/sys/fs/cgroup/unified")


def cgroup2_unwritable() -> str:
    """Why real cgroups cannot be created here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root to create cgroups"
    if not (UNIFIED / "cgroup.procs").exists():
        return f"no cgroup2 hierarchy mounted at {UNIFIED}"
    probe = UNIFIED / f"l9gpu-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"{UNIFIED} is not writable: {exc.strerror}"
    return ""


class Cgroups:
    """Creates cgroups under one parent and processes in them; `cleanup` undoes all."""

    def __init__(self) -> None:
        self.parent = UNIFIED / f"l9gpu-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.parent.mkdir()
        self.dirs: list[Path] = [self.parent]
        self.children: list[subprocess.Popen] = []

    def make(self, relative: str) -> Path:
        path = self.parent
        for part in relative.strip("/").split("/"):
            path = path / part
            if not path.exists():
                path.mkdir()
                self.dirs.append(path)
        return path

    def spawn(self, relative: str, argv: list[str] | None = None) -> subprocess.Popen:
        """Start ``argv`` (default ``sleep 600``) and move it into ``relative``."""
        child = subprocess.Popen(argv or ["sleep", "600"])
        self.adopt(child, relative)
        return child

    def adopt(self, child: subprocess.Popen, relative: str) -> None:
        """Move a child started elsewhere into ``relative``; `cleanup` kills it too."""
        self.children.append(child)
        self.move(child.pid, relative)

    def move(self, pid: int, relative: str) -> None:
        (self.make(relative) / "cgroup.procs").write_text(str(pid))

    def cleanup(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
            child.wait(30)
        for path in sorted(self.dirs, key=lambda p: len(p.parts), reverse=True):
            try:
                for pid in (path / "cgroup.procs").read_text().split():
                    (UNIFIED / "cgroup.procs").write_text(pid)  # anything left goes back to the root
                path.rmdir()
            except OSError:
                pass


@contextmanager
def cgroup_tree() -> Iterator[Cgroups]:
    """A `Cgroups` tree that is removed on exit, failure or not (and checked gone)."""
    tree = Cgroups()
    try:
        yield tree
    finally:
        tree.cleanup()
        assert not tree.parent.exists(), f"could not remove {tree.parent}"


def pod_uid() -> str:
    return str(uuid.uuid4())


def container_id() -> str:
    """A 64-hex container id, as containerd and CRI-O use."""
    return uuid.uuid4().hex + uuid.uuid4().hex


def burstable_scope(uid: str, cid: str) -> str:
    """The systemd-driver cgroup path of a Burstable pod's containerd container."""
    u = uid.replace("-", "_")
    return f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{cid}.scope"


class _HasUrl(Protocol):
    @property
    def url(self) -> str: ...


def kubeconfig(tmp_path: Path, server: _HasUrl) -> str:
    """A kubeconfig file pointing the kubernetes client at ``server`` (token auth)."""
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: test, cluster: {{server: "{server.url}"}}}}]
users: [{{name: test, user: {{token: test-token}}}}]
contexts: [{{name: test, context: {{cluster: test, user: test}}}}]
current-context: test
""")
    return str(path)


def spawn_with_pid(pid: int) -> subprocess.Popen | None:
    """A ``sleep`` child that gets ``pid`` (through /proc/sys/kernel/ns_last_pid), or None
    when that cannot be arranged (not root, or the PID taken meanwhile). The caller kills it."""
    for _ in range(20):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        child = subprocess.Popen(["sleep", "600"])
        if child.pid == pid:
            return child
        child.kill()
        child.wait()
    return None

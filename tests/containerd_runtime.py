"""A real containerd (Debian's, 1.6, CRI v1 plugin) and runc, driven as the kubelet drives them.

`Containerd` starts a private daemon: its own root, state, socket, runc root and config
(snapshotter overlayfs, or ``native`` where overlay cannot mount; the cgroupfs driver,
``SystemdCgroup = false``, since the systemd driver needs systemd as PID 1; no CNI, so pod
sandboxes use the node's network). No registry is reached: `build_image` writes a tiny
image from Debian's ``busybox-static`` (a docker-archive tarball, what ``ctr images
import`` takes), it is imported into the CRI plugin's ``k8s.io`` namespace, and
``sandbox_image`` points at it, so the plugin never pulls: it cannot, either, since the
image's registry is under the reserved ``.test`` domain, which never resolves.

`Kubelet` plays the kubelet over the CRI socket: ``RunPodSandbox`` with the cgroup parent
``/kubepods/<qos>/pod<uid>`` (or none, as with ``--cgroups-per-qos=false``), the
``io.kubernetes.*`` labels and annotations the kubelet sets, ``CreateContainer`` and
``StartContainer``, ``ExecSync``; it remembers everything it created, and `Kubelet.cleanup`
stops and removes it all, then removes the pod cgroups runc leaves behind (runc removes a
container's cgroup, never its parents).

On a cgroup v1 or hybrid host (as the test machines are: v1 controllers under
/sys/fs/cgroup, a cgroup2 hierarchy without controllers at /sys/fs/cgroup/unified) runc's
cgroupfs driver puts a container at the same path in every hierarchy, the cgroup2 one
included, and the cleanup covers them all. The daemon keeps every container's
``oom_score_adj`` at or above its own (``restrict_oom_score_adj``): lowering it, as the
kubelet asks for sandboxes and Guaranteed pods, needs ``CAP_SYS_RESOURCE``, which a test
machine that is itself a container may not have.

`unavailable` says why these tests cannot run here ("" when they can).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import tarfile
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waiting import PATIENCE, wait_until

IMAGE = "l9gpu.test/busybox:1"
CGROUP_ROOT = Path("/sys/fs/cgroup")
SLEEP_FOREVER = "2147483647"  # seconds; busybox sleep takes no "infinity"
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")
# Cgroups above the pods' that the kubelet and containerd make (deepest first):
# containerd's default parent for a container without one is /<namespace>, here k8s.io.
SHIM_SOCKETS = Path("/run/containerd/s")
PARENT_CGROUPS = ("kubepods/burstable", "kubepods/besteffort", "kubepods", "k8s.io")

# Plugins a private CRI daemon does not need (and that would probe the host for devices,
# filesystems or endpoints it does not have).
_DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.internal.v1.tracing",
    "io.containerd.tracing.processor.v1.otlp",
)


def unavailable() -> str:
    """Why a private containerd cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root to run containerd and runc"
    for tool, package in (("containerd", "containerd"), ("ctr", "containerd"),
                          ("containerd-shim-runc-v2", "containerd"), ("runc", "runc"), ("busybox", "busybox-static")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; `make test` installs it)"
    busybox = Path(shutil.which("busybox") or "")
    if not _static(busybox):
        return f"{busybox} is not statically linked (install Debian's busybox-static, not busybox)"
    if not (CGROUP_ROOT / "cgroup.controllers").exists() and not (CGROUP_ROOT / "memory").is_dir():
        return f"no cgroup hierarchy that runc can use under {CGROUP_ROOT}"
    probe = cgroup_dirs(f"l9gpu-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    made: list[Path] = []
    try:
        for path in probe:
            path.mkdir()
            made.append(path)
    except OSError as exc:
        return f"cannot create cgroups ({exc.filename}: {exc.strerror})"
    finally:
        for path in made:
            path.rmdir()
    return ""


def _static(binary: Path) -> bool:
    """True for an ELF file without a program interpreter (statically linked)."""
    data = binary.read_bytes()[:65536]
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit ELF only (what Debian ships here)
        return False
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize = int.from_bytes(data[0x36:0x38], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    for i in range(phnum):
        entry = data[phoff + i * phentsize: phoff + (i + 1) * phentsize]
        if int.from_bytes(entry[0:4], "little") == 3:  # PT_INTERP
            return False
    return True


def hierarchies() -> list[Path]:
    """The cgroup hierarchies runc writes to: the cgroup2 root on a unified host; on a v1 or
    hybrid host every mounted hierarchy (runc's cgroupfs driver uses the v1 ones there, and
    also puts the container at the same path in the cgroup2 one at /sys/fs/cgroup/unified)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    return sorted(p for p in CGROUP_ROOT.iterdir()
                  if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists())


def cgroup_dirs(relative: str) -> list[Path]:
    return [root / relative.strip("/") for root in hierarchies()]


def make_cgroup(relative: str) -> list[Path]:
    """Create ``relative`` in every hierarchy, ready for processes (a v1 cpuset cgroup takes
    none until it has CPUs and memory nodes: copied from its parent, as runc does)."""
    made: list[Path] = []
    try:
        for path in cgroup_dirs(relative):
            path.mkdir()
            made.append(path)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (path / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((path.parent / name).read_text())
    except OSError:
        for path in made:
            remove_cgroup(path)
        raise
    return made


def _go_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}.get(
        machine, machine)


def _tar_member(tar: tarfile.TarFile, name: str, kind: bytes, data: bytes = b"", mode: int = 0o755,
                link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.linkname = kind, mode, 0, link
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data else None)


def build_image(path: Path, reference: str = IMAGE) -> Path:
    """Write a docker-archive image (``ctr images import`` format) of busybox-static to ``path``.

    One layer: ``/bin/busybox`` and the applets the tests run (sh, sleep, cat) as links to
    it, and the directories a container needs. Its default command sleeps for ever, so it
    also serves as the pod sandbox ("pause") image.
    """
    busybox = Path(shutil.which("busybox") or "/bin/busybox").read_bytes()
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "run"):
            _tar_member(tar, directory, tarfile.DIRTYPE)
        _tar_member(tar, "bin/busybox", tarfile.REGTYPE, busybox)
        for applet in ("sh", "sleep", "cat", "true"):
            _tar_member(tar, f"bin/{applet}", tarfile.SYMTYPE, link="busybox")
        _tar_member(tar, "etc/passwd", tarfile.REGTYPE, b"root:x:0:0:root:/:/bin/sh\n", 0o644)
        _tar_member(tar, "etc/group", tarfile.REGTYPE, b"root:x:0:\n", 0o644)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": _go_arch(), "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Cmd": ["/bin/sleep", SLEEP_FOREVER], "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "l9gpu tests: busybox-static"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": ["layer/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as archive:
        _tar_member(archive, "layer", tarfile.DIRTYPE)
        _tar_member(archive, "layer/layer.tar", tarfile.REGTYPE, layer_bytes, 0o644)
        _tar_member(archive, config_name, tarfile.REGTYPE, config, 0o644)
        _tar_member(archive, "manifest.json", tarfile.REGTYPE, manifest, 0o644)
    return path


def overlay_works(directory: Path) -> bool:
    """True when an overlay filesystem mounts with its upper dir in ``directory``
    (not so on an overlay or some network filesystems, or without the module)."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return False
    base = Path(tempfile.mkdtemp(prefix="overlay-probe-", dir=directory))
    lower, upper, work, merged = (base / name for name in ("lower", "upper", "work", "merged"))
    for d in (lower, upper, work, merged):
        d.mkdir()
    try:
        result = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                                 f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)],
                                capture_output=True, timeout=PATIENCE)
        if result.returncode != 0:
            return False
        subprocess.run(["umount", str(merged)], capture_output=True, timeout=PATIENCE, check=True)
        return True
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Containerd:
    """A private containerd daemon with the CRI plugin, in ``base`` (a short path: sockets).

    ``start`` runs it and waits until the CRI answers; ``stop`` ends it (SIGTERM; the
    containers' shims keep running, as on a node whose containerd restarts); ``start``
    again restarts it on the same root, state and socket.
    """

    def __init__(self, base: Path, snapshotter: str, systemd_cgroup: bool = False):
        self.base = base
        self.systemd_cgroup = systemd_cgroup
        # The runc shim puts its sockets under /run/containerd/s whatever the daemon's state
        # dir: removed at teardown when this run made it.
        self.shim_dir_existed = SHIM_SOCKETS.exists()
        self.root, self.state = base / "root", base / "state"
        self.socket = str(base / "containerd.sock")
        self.runc_root = base / "runc"
        self.logs = base / "pod-logs"
        self.snapshotter = snapshotter
        self.config = base / "config.toml"
        self.log_path = base / "containerd.log"
        self.proc: subprocess.Popen | None = None
        for d in (self.root, self.state, self.runc_root, self.logs, base / "cni-bin", base / "cni-conf"):
            d.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self._config())

    def _config(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        disabled = ", ".join(json.dumps(p) for p in _DISABLED_PLUGINS)
        return f"""version = 2
root = "{self.root}"
state = "{self.state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{self.socket}.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[{cri}]
  sandbox_image = "{IMAGE}"
  enable_selinux = false
  disable_apparmor = true
  # Never below containerd's own oom_score_adj: lowering it needs CAP_SYS_RESOURCE, which
  # a test machine that is itself a container may lack (the sandbox asks for -998).
  restrict_oom_score_adj = true
  enable_cdi = false

[{cri}.containerd]
  snapshotter = "{self.snapshotter}"
  default_runtime_name = "runc"
  discard_unpacked_layers = false

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = {"true" if self.systemd_cgroup else "false"}
  Root = "{self.runc_root}"

[{cri}.cni]
  bin_dir = "{self.base / 'cni-bin'}"
  conf_dir = "{self.base / 'cni-conf'}"
"""

    def start(self, timeout: float = PATIENCE) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["containerd", "--config", str(self.config)], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_until(lambda: self.proc is not None and (self.proc.poll() is not None or self.answers()), timeout,
                   "containerd's CRI socket answering")
        if self.proc.poll() is not None:
            raise RuntimeError(f"containerd exited with {self.proc.returncode}:\n{self.log()[-4000:]}")

    def answers(self) -> bool:
        if not os.path.exists(self.socket):
            return False
        result = self.ctr("version", check=False, timeout=PATIENCE)
        return result.returncode == 0

    def stop(self, timeout: float = PATIENCE) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL); its shims and containers keep running."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ctr(self, *args: str, check: bool = True, timeout: float = PATIENCE) -> subprocess.CompletedProcess:
        result = subprocess.run(["ctr", "--address", self.socket, *args], capture_output=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {result.stderr.decode(errors='replace').strip()}")
        return result

    def import_image(self, archive: Path) -> None:
        self.ctr("-n", "k8s.io", "images", "import", "--snapshotter", self.snapshotter, "--no-unpack=false",
                 str(archive))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class Pod:
    """A pod sandbox as the kubelet made it, and the containers made in it."""

    name: str
    namespace: str
    uid: str
    qos: str  # guaranteed, burstable, besteffort, or "" for no pod cgroup
    sandbox_id: str
    config: Any
    cgroup_parent: str
    containers: dict[str, str] = field(default_factory=dict)  # container id -> name


class Kubelet:
    """Creates pods and containers over the CRI socket as the kubelet does, and removes them.

    Args:
        containerd: the runtime to talk to.
        api: the test CRI messages module (cri_runtime_api_pb2).
        grpc: the grpc module.
    """

    SERVICE = "/runtime.v1.RuntimeService/"

    def __init__(self, containerd: Containerd, api: Any, grpc: Any):
        self.containerd = containerd
        self.api = api
        self.grpc = grpc
        self.pods: list[Pod] = []
        self.cgroups: list[str] = []  # pod cgroup parents made, e.g. /kubepods/burstable/pod<uid>
        self.preexisting = {rel for rel in PARENT_CGROUPS if any(d.exists() for d in cgroup_dirs(rel))}
        self._channel: Any = None

    def channel(self) -> Any:
        if self._channel is None:
            self._channel = self.grpc.insecure_channel("unix:" + self.containerd.socket)
        return self._channel

    def call(self, method: str, request: Any, response: Any, timeout: float = PATIENCE) -> Any:
        stub = self.channel().unary_unary(self.SERVICE + method, request_serializer=type(request).SerializeToString,
                                          response_deserializer=response.FromString)
        return stub(request, timeout=timeout)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # ---- what the kubelet sends ------------------------------------------------------

    def run_pod(self, name: str, namespace: str, qos: str, uid: str | None = None, pod_cgroup: bool = True,
                cgroup_parent: str | None = None) -> Pod:
        """RunPodSandbox as the kubelet does for a hostNetwork pod of QoS class ``qos``.

        ``pod_cgroup`` False sends no cgroup parent, as a kubelet with
        ``--cgroups-per-qos=false`` does: containerd then puts the pod's containers at
        ``/k8s.io/<container id>``. ``cgroup_parent`` sends that one instead (the systemd
        driver's slice name), made by no one here.
        """
        api = self.api
        uid = uid or str(uuid.uuid4())
        parent = cgroup_parent or ""
        if pod_cgroup and cgroup_parent is None:
            parent = f"/kubepods/pod{uid}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{uid}"
            self.cgroups.append(parent)
            self._make_pod_cgroup(parent)  # the kubelet's pod container manager makes it first
        labels = {"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                  "io.kubernetes.pod.uid": uid}
        config = api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            # No hostname: the kubelet sets one only for pods with their own network namespace.
            log_directory=str(self.containerd.logs / f"{namespace}_{name}_{uid}"),
            labels=labels,
            annotations={"kubernetes.io/config.source": "api", "kubernetes.io/config.seen": "2026-01-01T00:00:00Z"},
            linux=api.LinuxPodSandboxConfig(
                cgroup_parent=parent,
                security_context=api.LinuxSandboxSecurityContext(namespace_options=api.NamespaceOption(
                    network=api.NODE, pid=api.CONTAINER, ipc=api.POD))))
        sandbox = self.call("RunPodSandbox", api.RunPodSandboxRequest(config=config), api.RunPodSandboxResponse)
        pod = Pod(name, namespace, uid, qos if parent else "", sandbox.pod_sandbox_id, config, parent)
        self.pods.append(pod)
        return pod

    def _make_pod_cgroup(self, parent: str) -> None:
        for path in cgroup_dirs(parent):
            path.mkdir(parents=True, exist_ok=True)

    def start_container(self, pod: Pod, name: str, attempt: int = 0, command: list[str] | None = None) -> str:
        """CreateContainer + StartContainer; returns the container id."""
        api = self.api
        resources = {
            "guaranteed": api.LinuxContainerResources(cpu_period=100000, cpu_quota=20000, cpu_shares=204,
                                                      memory_limit_in_bytes=64 << 20, oom_score_adj=-997),
            "burstable": api.LinuxContainerResources(cpu_period=100000, cpu_shares=102, oom_score_adj=999),
        }.get(pod.qos, api.LinuxContainerResources(cpu_period=100000, cpu_shares=2, oom_score_adj=1000))
        labels = {"io.kubernetes.container.name": name, "io.kubernetes.pod.name": pod.name,
                  "io.kubernetes.pod.namespace": pod.namespace, "io.kubernetes.pod.uid": pod.uid}
        annotations = {"io.kubernetes.container.hash": "5d5a3d3c", "io.kubernetes.container.restartCount": str(attempt),
                       "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                       "io.kubernetes.container.terminationMessagePolicy": "File",
                       "io.kubernetes.pod.terminationGracePeriod": "30"}
        config = api.ContainerConfig(
            metadata=api.ContainerMetadata(name=name, attempt=attempt), image=api.ImageSpec(image=IMAGE),
            command=command or ["/bin/sleep", SLEEP_FOREVER], labels=labels, annotations=annotations,
            log_path=f"{name}/{attempt}.log", envs=[api.KeyValue(key="KUBERNETES_SERVICE_HOST", value="10.96.0.1")],
            linux=api.LinuxContainerConfig(resources=resources, security_context=api.LinuxContainerSecurityContext(
                namespace_options=api.NamespaceOption(network=api.NODE, pid=api.CONTAINER, ipc=api.POD))))
        created = self.call("CreateContainer", api.CreateContainerRequest(
            pod_sandbox_id=pod.sandbox_id, config=config, sandbox_config=pod.config), api.CreateContainerResponse)
        pod.containers[created.container_id] = name
        self.call("StartContainer", api.StartContainerRequest(container_id=created.container_id),
                  api.StartContainerResponse)
        return created.container_id

    def stop_container(self, container_id: str) -> None:
        """StopContainer with no grace period (SIGKILL at once), as after a failed probe."""
        api = self.api
        self.call("StopContainer", api.StopContainerRequest(container_id=container_id, timeout=0),
                  api.StopContainerResponse)

    def remove_container(self, pod: Pod, container_id: str) -> None:
        api = self.api
        self.call("RemoveContainer", api.RemoveContainerRequest(container_id=container_id),
                  api.RemoveContainerResponse)
        pod.containers.pop(container_id, None)

    def pid(self, container_id: str) -> int:
        """The host PID of a running container's first process (ContainerStatus verbose info)."""
        api = self.api
        status = self.call("ContainerStatus", api.ContainerStatusRequest(container_id=container_id, verbose=True),
                           api.ContainerStatusResponse)
        return int(json.loads(status.info["info"])["pid"])

    def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 30) -> Any:
        api = self.api
        return self.call("ExecSync", api.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout),
                         api.ExecSyncResponse, timeout=timeout + PATIENCE)

    # ---- cleaning up ------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Stop and remove every container and sandbox made, then the pod cgroups.

        Returns what could not be removed (empty when all went): the caller fails on it.
        """
        problems: list[str] = []
        api = self.api
        if self.containerd.running:
            for pod in self.pods:
                for cid in list(pod.containers):
                    for method, request, response in (
                            ("StopContainer", api.StopContainerRequest(container_id=cid, timeout=0),
                             api.StopContainerResponse),
                            ("RemoveContainer", api.RemoveContainerRequest(container_id=cid),
                             api.RemoveContainerResponse)):
                        try:
                            self.call(method, request, response)
                        except self.grpc.RpcError as exc:
                            problems.append(f"{method} {cid[:12]}: {exc.details()}")
                for method, request, response in (
                        ("StopPodSandbox", api.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id),
                         api.StopPodSandboxResponse),
                        ("RemovePodSandbox", api.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id),
                         api.RemovePodSandboxResponse)):
                    try:
                        self.call(method, request, response)
                    except self.grpc.RpcError as exc:
                        problems.append(f"{method} {pod.name}: {exc.details()}")
        elif self.pods:
            problems.append("containerd was not running at cleanup: pods left to Containerd's teardown")
        self.pods = [] if not problems else self.pods
        problems += self.remove_cgroups()
        self.close()
        return problems

    def remove_cgroups(self) -> list[str]:
        """Remove the pod cgroups made, and the parents (``kubepods``, its QoS cgroups,
        ``k8s.io``) that this run created where nothing else uses them any more."""
        problems: list[str] = []
        for rel in dict.fromkeys(self.cgroups):
            for path in cgroup_dirs(rel):
                if path.exists():
                    try:  # StopPodSandbox waited for the processes; the kernel may lag a little
                        wait_until(lambda p=path: remove_cgroup(p), 30, f"{path} removed")
                    except AssertionError as exc:
                        problems.append(str(exc))
        for rel in PARENT_CGROUPS:
            if rel not in self.preexisting:
                for path in cgroup_dirs(rel):
                    _rmdir_if_empty(path)  # another run's pods may be in it: then it stays
        return problems


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def remove_cgroup(path: Path) -> bool:
    try:
        for child in sorted((p for p in path.iterdir() if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            remove_cgroup(child)
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def teardown_daemon(containerd: Containerd) -> list[str]:
    """After the tests: every container the daemon still knows removed, daemon stopped,
    every mount under its root and state unmounted, its directories removed."""
    problems: list[str] = []
    if not containerd.running:
        try:
            containerd.start()
        except Exception as exc:
            problems.append(f"could not restart containerd to clean up: {exc}")
    if containerd.running:
        for ns in ("k8s.io",):
            listed = containerd.ctr("-n", ns, "tasks", "ls", "-q", check=False)
            for task in listed.stdout.decode().split():
                containerd.ctr("-n", ns, "tasks", "kill", "-s", "SIGKILL", task, check=False)
                containerd.ctr("-n", ns, "tasks", "delete", "-f", task, check=False)
            listed = containerd.ctr("-n", ns, "containers", "ls", "-q", check=False)
            for container in listed.stdout.decode().split():
                problems.append(f"container {container[:12]} was left in containerd")
                containerd.ctr("-n", ns, "containers", "delete", container, check=False)
    containerd.stop()
    problems += unmount_below(containerd.base)
    if not containerd.shim_dir_existed:
        for directory in (SHIM_SOCKETS, SHIM_SOCKETS.parent):
            _rmdir_if_empty(directory)
    shutil.rmtree(containerd.base, ignore_errors=True)
    if containerd.base.exists():
        problems.append(f"could not remove {containerd.base}")
    return problems


def unmount_below(base: Path) -> list[str]:
    """Unmount everything mounted at or below ``base`` (deepest first); what stayed mounted."""
    def mounted() -> list[str]:
        points = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            point = line.split()[1].replace("\\040", " ")
            if point == str(base) or point.startswith(str(base) + "/"):
                points.append(point)
        return sorted(points, key=len, reverse=True)

    for point in mounted():
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=PATIENCE)
    return [f"{p} still mounted" for p in mounted()]


def read_cgroup(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def host_pid(container_pid: int, container_id: str) -> int | None:
    """The host PID of the process that has PID ``container_pid`` inside the container
    ``container_id`` (from ``NSpid`` in /proc/<pid>/status), or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if container_id not in read_cgroup(int(entry)):
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and line.split()[-1] == str(container_pid):
                return int(entry)
    return None

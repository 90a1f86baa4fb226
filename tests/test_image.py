"""The agent's image, built from the repository's Dockerfile with Debian's buildah, and run.

No container registry can be reached from CI, so the Dockerfile's ``BASE`` (the Python
image by its tag) is stood in for by a Debian bookworm bootstrapped here (debootstrap,
minbase, with Debian's Python 3.11 and its headers: what the official image holds), imported
as an image. Everything else is the Dockerfile as users build it: its two stages, its
locked dependencies from PyPI (requirements/), its labels. Then, in the image:
``l9gpu --version``, the simulated node's snapshot, and the kernel log read from a journal
mounted into it, as root and as a user outside the journal's group (the WARNING that
says which group to run in). And what was installed is exactly the lock: two builds of one
commit install the same versions.

It takes a few minutes and root: it runs with ``make image-test`` (L9GPU_IMAGE_TEST=1),
which installs buildah and debootstrap; ``.ci/run`` runs it after the suite. buildah stores
layers with overlay where the kernel lets it, else vfs. The bootstrapped base is kept in
``L9GPU_IMAGE_CACHE`` (default /var/tmp/l9gpu-image-test); the image itself is built
whole each time, from PyPI and Debian's mirror.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from functools import cache
from pathlib import Path

import pytest
from journal_helpers import append_entries, journal_unavailable, kernel_entry

from exporter import __version__

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("L9GPU_IMAGE_CACHE", "/var/tmp/l9gpu-image-test"))
STANDIN = "localhost/l9gpu-base-standin:bookworm"
IMAGE = "localhost/l9gpu:image-test"
# What the official python:3.11-slim-bookworm holds that a minbase bootstrap lacks.
STANDIN_PACKAGES = ("python3", "python3-venv", "python3-dev", "libsystemd0")
XID_31 = "NVRM: Xid (PCI:0000:38:00): 31, pid=52001, name=python3, Ch 00000008, intr 00000000. MMU Fault"
MACHINE = "0123456789abcdef0123456789abcdef"
JOURNAL_GROUP = 4242


def _why_not() -> str:
    if not os.environ.get("L9GPU_IMAGE_TEST"):
        return "the image build takes minutes: `make image-test` runs it (L9GPU_IMAGE_TEST=1)"
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (Debian packages; `make image-test` installs them)"
    if os.geteuid() != 0:
        return "buildah's vfs storage and debootstrap need root here"
    return journal_unavailable()


pytestmark = pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "ok")


@cache
def storage_driver() -> str:
    """overlay where this kernel mounts it for buildah (layers stored as differences), else
    vfs (a full copy per layer: slower, many times the disk, but needs nothing)."""
    probe = CACHE / "probe"
    probe.mkdir(parents=True, exist_ok=True)
    (probe / "Containerfile").write_text("FROM scratch\nCOPY Containerfile /probe\n")
    done = subprocess.run(["buildah", "--root", str(CACHE / "storage-overlay"), "--runroot", str(CACHE / "run-overlay"),
                           "--storage-driver", "overlay", "build", "--isolation", "chroot", "-t", "localhost/probe",
                           str(probe)], capture_output=True, text=True, timeout=300)
    return "overlay" if done.returncode == 0 else "vfs"


def buildah(*args: str, timeout: float = 1200, check: bool = True) -> subprocess.CompletedProcess:
    """buildah on storage of its own under the cache, with chroot isolation (no user
    namespaces needed)."""
    driver = storage_driver()
    done = subprocess.run(["buildah", "--root", str(CACHE / f"storage-{driver}"), "--runroot",
                           str(CACHE / f"run-{driver}"), "--storage-driver", driver, *args],
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"buildah {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _standin_base() -> None:
    """The bootstrapped Debian, imported as ``STANDIN`` (once per cache), with the CA
    certificates this machine trusts (pip in the build reaches PyPI through them)."""
    key = "-".join(STANDIN_PACKAGES)
    tar = CACHE / f"bookworm-{key}.tar"
    if not tar.exists():
        rootfs = CACHE / "rootfs"
        shutil.rmtree(rootfs, ignore_errors=True)
        done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(STANDIN_PACKAGES)}",
                               "bookworm", str(rootfs), "http://deb.debian.org/debian"],
                              capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with tarfile.open(tar.with_suffix(".part"), "w") as out:
            out.add(rootfs, arcname=".")
        tar.with_suffix(".part").rename(tar)
        shutil.rmtree(rootfs)
    context = CACHE / "standin"
    context.mkdir(exist_ok=True)
    if not (context / "base.tar").exists() or (context / "base.tar").stat().st_ino != tar.stat().st_ino:
        (context / "base.tar").unlink(missing_ok=True)
        os.link(tar, context / "base.tar")
    shutil.copyfile("/etc/ssl/certs/ca-certificates.crt", context / "ca-certificates.crt")
    (context / "Containerfile").write_text(
        "FROM scratch\nADD base.tar /\nCOPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
        "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt\nCMD [\"/bin/bash\"]\n")
    buildah("build", "--isolation", "chroot", "--layers", "--force-rm", "-t", STANDIN, str(context))


def _revision() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


@pytest.fixture(scope="module")
def image() -> dict:
    """The image built from the Dockerfile on the stand-in base; its inspection, and the
    revision it was built from (``revision``)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    _standin_base()
    revision = _revision()
    # A layer per instruction, as docker builds it, and none taken from an earlier build:
    # what is checked below is what this commit's Dockerfile installs (buildah 1.28's layer
    # cache keys a LABEL by its text before ARGs are expanded: it would keep an earlier
    # revision's label).
    buildah("build", "--isolation", "chroot", "--layers", "--no-cache", "--force-rm", "--pull=never",
            "--build-arg", f"BASE={STANDIN}", "--build-arg", f"VERSION={__version__}",
            "--build-arg", f"REVISION={revision}", "-t", IMAGE, str(REPO))
    buildah("rmi", "--prune", check=False)  # the image this tag named before
    return {**json.loads(buildah("inspect", "--type", "image", IMAGE).stdout), "revision": revision}


@pytest.fixture(scope="module")
def container(image):
    name = buildah("from", "--pull=never", IMAGE).stdout.strip()
    yield name
    buildah("rm", name, check=False)


def run_in(container: str, *cmd: str, user: str | None = None, mounts: tuple[str, ...] = ()
           ) -> subprocess.CompletedProcess:
    args = ["run", "--isolation", "chroot"]
    args += ["--user", user] if user else []
    for mount in mounts:
        args += ["-v", mount]
    return buildah(*args, container, "--", *cmd, timeout=300, check=False)


def test_labels_workdir_and_entrypoint(image):
    config = image["OCIv1"]["config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.revision"] == image["revision"]
    assert labels["org.opencontainers.image.title"] == "l9gpu"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.base.name"] == STANDIN
    assert config["Entrypoint"] == ["l9gpu"] and config["Cmd"] == ["serve"]
    assert config["WorkingDir"] == "/"


def test_no_layer_holds_the_sources_or_the_compiler(image, tmp_path):
    """Only the installed environment is copied out of the build stage: no layer of the
    image has /src, a test, the git history or gcc."""
    out = tmp_path / "oci"
    buildah("push", "--disable-compression", IMAGE, f"oci:{out}")
    index = json.loads((out / "index.json").read_text())
    digest = index["manifests"][0]["digest"].split(":", 1)[1]
    manifest = json.loads((out / "blobs" / "sha256" / digest).read_text())
    names: list[str] = []
    for layer in manifest["layers"]:
        with tarfile.open(out / "blobs" / "sha256" / layer["digest"].split(":", 1)[1]) as tar:
            names += tar.getnames()
    shutil.rmtree(out)
    assert any(n.endswith("opt/l9gpu/bin/l9gpu") for n in names)
    assert any(re.search(r"opt/l9gpu/lib/python3\.\d+/site-packages/exporter/__init__\.py$", n) for n in names)
    # the checkout (the build stage's /src, its tests, setup.cfg, git), or the build's compiler
    leaks = [n for n in names if re.match(r"(\./)?src(/|$)", n) or re.search(r"(^|/)\.git/", n)
             or re.search(r"(^|/)(test_image\.py|\.dockerignore|l9gpu-chargeback\.rules\.yaml)$", n)
             or (re.search(r"(^|/)exporter/__init__\.py$", n) and "/site-packages/" not in n)
             or re.search(r"(^|/)usr/bin/(x86_64-linux-gnu-)?gcc(-\d+)?$", n)]
    assert not leaks, leaks[:20]


def test_version_and_the_simulated_node(container):
    done = run_in(container, "l9gpu", "--version")
    assert done.returncode == 0, done.stderr
    assert __version__ in done.stdout
    done = run_in(container, "l9gpu", "snapshot", "--backend", "simulated", "--json")
    assert done.returncode == 0, done.stderr
    snap = json.loads(done.stdout)
    assert len(snap["gpus"]) == 8 and snap["node"] == "sim-node-01"
    pods = {p["pod"] for g in snap["gpus"] for p in g["processes"] if p.get("pod")}
    assert "vllm-llama3-70b-6d8b94df7-q5z82" in pods and "jupyter-alice-0" in pods


READ_JOURNAL = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout, "
                "format='%(levelname)s %(message)s'); from exporter.incidents.journal import JournalKernelLog; "
                "j = JournalKernelLog('/var/log/journal', from_start=True); j.sync(); "
                "print('xids', [r.xid for r in j.poll()])")


def test_the_journal_is_read_in_the_image_and_a_user_outside_its_group_is_warned(container, tmp_path):
    """systemd-python, built in the image's first stage, reads a real journal file mounted
    read-only as the chart mounts the host's; a user outside the file's group reads nothing
    and is told at WARNING which group to run in; in that group it reads the Xid."""
    journal = tmp_path / "journal"
    append_entries(journal / MACHINE / "system.journal", [kernel_entry(XID_31)])
    os.chown(journal / MACHINE / "system.journal", 0, JOURNAL_GROUP)
    os.chmod(journal / MACHINE / "system.journal", 0o640)
    for path in (journal, journal / MACHINE):
        path.chmod(0o755)
    mount = (f"{journal}:/var/log/journal:ro",)
    python = "/opt/l9gpu/bin/python"
    as_root = run_in(container, python, "-c", READ_JOURNAL, mounts=mount)
    assert as_root.returncode == 0, as_root.stderr
    assert "xids [31]" in as_root.stdout, as_root.stdout
    outside = run_in(container, python, "-c", READ_JOURNAL, user="65534:65534", mounts=mount)
    assert outside.returncode == 0, outside.stderr
    assert "xids []" in outside.stdout
    assert re.search(r"^WARNING the journal at /var/log/journal has 1 file\(s\) the agent may not read "
                     rf"\(UID 65534; .*group GID {JOURNAL_GROUP}\)", outside.stdout, re.M), outside.stdout
    inside = run_in(container, python, "-c", READ_JOURNAL, user=f"65534:{JOURNAL_GROUP}", mounts=mount)
    assert inside.returncode == 0, inside.stderr
    assert "xids [31]" in inside.stdout and "WARNING" not in inside.stdout


def _pins(*locks: Path) -> dict[str, str]:
    pins = {}
    for lock in locks:
        for name, version in re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", lock.read_text(), re.M):
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_the_image_installs_exactly_the_lock(container):
    """Two builds of one commit install the same versions: every distribution in the image
    (build tools included) is the lock's, at the lock's version, and nothing else is there."""
    done = run_in(container, "/opt/l9gpu/bin/pip", "freeze", "--all", "--exclude", "pip", "--exclude", "l9gpu-agent")
    assert done.returncode == 0, done.stderr
    installed = {re.sub(r"[-_.]+", "-", name).lower(): version
                 for name, version in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$", done.stdout, re.M)}
    assert len(installed) == len(done.stdout.split()), done.stdout  # every line is a pin
    assert installed == _pins(REPO / "requirements" / "image.txt", REPO / "requirements" / "image-build.txt")

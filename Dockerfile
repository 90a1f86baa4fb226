# The l9gpu node agent. NVML comes from the host driver (NVIDIA container toolkit or a
# mounted libnvidia-ml.so); amdsmi and hl-smi from the vendor's runtime image or a mount.
#   docker build -t l9gpu --build-arg VERSION=0.2.0 --build-arg REVISION=$(git rev-parse HEAD) .
#   docker run --rm --pid=host --gpus all -p 9835:9835 l9gpu serve
#
# Two stages: the build stage compiles and installs into a virtual environment, and only
# that environment is copied into the image, so no source file, compiler or package list
# is in any of its layers. What is installed is pinned with hashes in requirements/
# (`make image-lock` refreshes both files; `make image-test` builds this file and checks
# the image's `pip freeze` against them).
#
# BASE is the Python image by its full version tag. For byte-identical rebuilds pin it by
# digest as well: --build-arg BASE=python:3.11.14-slim-bookworm@sha256:<digest>, the
# digest as `docker buildx imagetools inspect python:3.11.14-slim-bookworm` (or
# `skopeo inspect docker://python:3.11.14-slim-bookworm`) prints it.
ARG BASE=python:3.11.14-slim-bookworm

FROM ${BASE} AS build
# systemd-python (the kernel log from the host's journal) builds against libsystemd: the
# headers, pkg-config and a compiler here; libsystemd0 (in the base) at run time.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libsystemd-dev pkg-config \
    && python3 -m venv /opt/l9gpu
COPY requirements/image-build.txt requirements/image.txt /tmp/requirements/
RUN /opt/l9gpu/bin/pip install --no-cache-dir --require-hashes -r /tmp/requirements/image-build.txt \
    && /opt/l9gpu/bin/pip install --no-cache-dir --no-build-isolation --require-hashes -r /tmp/requirements/image.txt
WORKDIR /src
COPY setup.cfg pyproject.toml README.md ./
COPY exporter ./exporter
COPY bridge ./bridge
# the agent itself, its extras ([all,journal]) already installed from the lock
RUN /opt/l9gpu/bin/pip install --no-cache-dir --no-build-isolation --no-deps . \
    && /opt/l9gpu/bin/pip check

FROM ${BASE}
ARG BASE
ARG VERSION=0.2.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="l9gpu" \
      org.opencontainers.image.description="GPU telemetry agent that attributes GPU memory, utilisation and energy to pods, containers and Slurm jobs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE}"
COPY --from=build /opt/l9gpu /opt/l9gpu
ENV PATH=/opt/l9gpu/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
WORKDIR /
EXPOSE 9835
ENTRYPOINT ["l9gpu"]
CMD ["serve"]

# The l9gpu node agent. NVML comes from the host driver (NVIDIA container toolkit or a
# mounted libnvidia-ml.so); amdsmi and hl-smi from the vendor's runtime image or a mount.
#   docker build -t l9gpu .
#   docker run --rm --pid=host --gpus all -p 9835:9835 l9gpu serve
FROM python:3.11-slim

WORKDIR /src
COPY setup.cfg pyproject.toml README.md ./
COPY exporter ./exporter
COPY bridge ./bridge
# systemd-python (the kernel log from the host's journal) builds against libsystemd: the
# headers, pkg-config and a compiler for the build, libsystemd0 (in the base) at run time.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libsystemd-dev pkg-config \
    && pip install --no-cache-dir '.[all,journal]' \
    && apt-get purge -y --auto-remove gcc libc6-dev libsystemd-dev pkg-config \
    && rm -rf /var/lib/apt/lists/* /src

EXPOSE 9835
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
ENTRYPOINT ["l9gpu"]
CMD ["serve"]

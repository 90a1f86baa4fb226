# The l9gpu node agent. NVML comes from the host driver (NVIDIA container toolkit or a
# mounted libnvidia-ml.so); amdsmi and hl-smi from the vendor's runtime image or a mount.
#   docker build -t l9gpu .
#   docker run --rm --pid=host --gpus all -p 9835:9835 l9gpu serve
FROM python:3.11-slim

WORKDIR /src
COPY setup.cfg pyproject.toml README.md ./
COPY exporter ./exporter
COPY bridge ./bridge
RUN pip install --no-cache-dir '.[all]' && rm -rf /src

EXPOSE 9835
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
ENTRYPOINT ["l9gpu"]
CMD ["serve"]

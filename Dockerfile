# gpuplace image: the extender (gpuplace-extender), the node agent (gpuplace-agent) and the CLI
# (gpuplace), for people with a Docker daemon. CI builds the same image offline, without Docker
# or a registry, with hack/build-images.sh (Debian bookworm's python3 from mmdebstrap, then the
# same venv, user, ENV and CMD as below); tests/images checks that this file's final stage and
# that image's config agree.
#   docker build -t REGISTRY/gpuplace:0.1.0 .
#   helm install gpuplace deploy/helm/gpuplace --set image.repository=REGISTRY/gpuplace
# The agent needs the NVIDIA driver's libnvidia-ml.so from the host; the NVIDIA container runtime
# injects it (chart value agent.runtimeClassName, e.g. "nvidia").

# Build: the wheel from the source tree, and the wheels of its dependencies (+ podresources).
FROM debian:bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# What the wheel is built from (hack/build-images.sh copies the same files). Not testing/ (the
# gpuplace-testing distribution: the NVML and AMD SMI stand-ins): the image holds the product only,
# so gpuplace-agent --probe fake-nvml / fake-amdsmi exit 2 in it, naming the missing package.
COPY pyproject.toml README.md LICENSE ./
COPY scheduler_extender scheduler_extender
COPY node_agent node_agent
RUN python3 -m pip wheel --no-cache-dir --no-deps -w /wheels . \
 && python3 -m pip download --no-cache-dir --only-binary=:all: --dest /wheels \
      "$(ls /wheels/gpuplace-*.whl)[podresources]" \
 && python3 -m pip download --no-cache-dir --only-binary=:all: --no-deps --dest /pip pip
# A venv on Debian's own python3; pip runs from its wheel so that no pip is left in the venv.
# Bytecode is checked against the source's hash, not its mtime: a read-only root filesystem needs
# no writes at start-up.
RUN python3 -m venv --without-pip /opt/gpuplace \
 && /opt/gpuplace/bin/python "$(ls /pip/pip-*.whl)/pip" install --no-index --find-links /wheels \
      --no-cache-dir --no-compile --disable-pip-version-check --no-warn-script-location \
      "$(ls /wheels/gpuplace-*.whl)[podresources]" \
 && (/opt/gpuplace/bin/python -m compileall -q -q --invalidation-mode checked-hash /opt/gpuplace/lib || true)

FROM debian:bookworm-slim
# libstdc++6: manylinux wheels (grpcio) link it and expect the system to have it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libstdc++6 \
 && rm -rf /var/lib/apt/lists/* \
 && echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'nonroot:x:65532:' >> /etc/group \
 && install -d -m 0755 -o 65532 -g 65532 /home/nonroot
COPY --from=build /opt/gpuplace /opt/gpuplace
ENV PATH=/opt/gpuplace/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8
WORKDIR /home/nonroot
# 65532: the "nonroot" user the chart's securityContext runs the extender as.
USER 65532:65532
ENTRYPOINT []
CMD ["gpuplace-extender", "--help"]

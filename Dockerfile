# gpuplace image: the extender (gpuplace-extender) and the node agent (gpuplace-agent).
# Not built in CI. Build and push it yourself, then point the chart at it:
#   docker build -t REGISTRY/gpuplace:0.1.0 .
#   helm install gpuplace deploy/helm/gpuplace --set image.repository=REGISTRY/gpuplace
# The agent needs the NVIDIA driver's libnvidia-ml.so from the host; the NVIDIA container runtime
# injects it (chart value agent.runtimeClassName, e.g. "nvidia").
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler_extender scheduler_extender
COPY node_agent node_agent
RUN pip install --no-cache-dir --prefix=/install '.[podresources]'

FROM python:3.11-slim
COPY --from=build /install /usr/local
# 65532: the "nonroot" user the chart's securityContext runs the extender as.
USER 65532:65532
ENTRYPOINT []
CMD ["gpuplace-extender", "--help"]

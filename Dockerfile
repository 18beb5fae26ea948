# The acp-serve image the Kubernetes manifests run (deploy/k8s: image acp-serve:0.1.0).
#   docker build -t acp-serve:0.1.0 .
#   docker run --rm -p 4170:4170 -e QWEN_SERVER_TOKEN=$(openssl rand -hex 24) acp-serve:0.1.0
# It holds the daemon and the built-in scripted agent (good for trying things); put your
# agent in an image built FROM this one (see docs/kubernetes.md "The image").
FROM python:3.13-slim

# The manifests' non-root user (runAsUser/runAsGroup 10001).
RUN useradd --uid 10001 --user-group --no-create-home acp

COPY pyproject.toml README.md /src/
COPY actors /src/actors
COPY acp /src/acp
COPY serve /src/serve
# With the postgres extra (psycopg 3 and its pool): --journal-url, the N-replica overlay.
RUN pip install --no-cache-dir --disable-pip-version-check "/src[postgres]" \
    && python -m compileall -q "$(python -c 'import serve, os; print(os.path.dirname(os.path.dirname(serve.__file__)))')" \
    && rm -rf /src \
    && mkdir -p /workspace /state \
    && chown 10001:10001 /workspace /state

USER 10001
ENV HOME=/state/home
WORKDIR /workspace
EXPOSE 4170
# PID 1 is the daemon itself: it reaps its agents' orphans (docs/reference/operating.md).
# Any bind but loopback needs a token (QWEN_SERVER_TOKEN or --token).
ENTRYPOINT ["acp-serve"]
CMD ["--hostname", "0.0.0.0", "--port", "4170", "--workspace", "/workspace", "--state-dir", "/state", "--require-auth"]

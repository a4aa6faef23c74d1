# horde_lite's server. By default it keeps its SQLite file in the /data volume; set
# HORDE_LITE_DATABASE__URL for PostgreSQL (compose.yaml). Migrations are applied at start-up.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HORDE_LITE_DATABASE__URL=sqlite+aiosqlite:////data/horde_lite.db

WORKDIR /app
COPY pyproject.toml README.md litestar.toml ./
COPY horde_lite ./horde_lite
# The built-in policies' folder; pyproject.toml installs it as the package horde_lite_policies.
COPY plugins ./plugins
RUN pip install --no-cache-dir '.[redis]' \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin horde \
    && mkdir /data && chown horde /data

USER horde
VOLUME ["/data"]
EXPOSE 8000
# Healthy while the server answers its heartbeat. The slim image has no curl: Python's urllib exits
# non-zero on a refused connection, a timeout or an answer other than 2xx. Serving on another
# port? Set HORDE_LITE_HEALTHCHECK_URL to match.
ENV HORDE_LITE_HEALTHCHECK_URL=http://127.0.0.1:8000/api/v2/status/heartbeat
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['HORDE_LITE_HEALTHCHECK_URL'], timeout=4)"]
ENTRYPOINT ["horde-lite"]
CMD ["run", "--host", "0.0.0.0", "--port", "8000"]

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
ENTRYPOINT ["horde-lite"]
CMD ["run", "--host", "0.0.0.0", "--port", "8000"]

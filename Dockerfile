# The matcher daemon image. The Helm chart in helm/matcher runs it as `matcher run` and
# `matcher migrate`; `docker run IMAGE --help` lists the other commands.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The producer SDK is local: matcher depends on it by name, and installing both in one
# command lets pip resolve that name to the local copy instead of an index.
COPY producers/python producers/python
COPY pyproject.toml README.md constraints.txt ./
COPY matcher matcher
# A virtualenv keeps the install in one directory to copy into a runtime stage without pip.
# The product and its runtime dependencies only (no test, lint, bench or docs groups, no
# devstack), at the versions the tests passed with.
RUN python -m venv /opt/matcher \
 && /opt/matcher/bin/pip install -c constraints.txt ./producers/python .

FROM python:3.11-slim
# The root filesystem is read-only in the chart: no bytecode writes, and /tmp is a volume.
# The admin API listens on all interfaces: the daemon's loopback default would be unreachable
# from outside the container (the chart sets the same value explicitly).
ENV PATH=/opt/matcher/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MATCHER_ADMIN_ADDRESS=0.0.0.0:9464
RUN groupadd --system --gid 10001 matcher \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin matcher
COPY --from=build /opt/matcher /opt/matcher
# Numeric, so that runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# The admin API: /healthz, /readyz, /metrics, /v1/*.
EXPOSE 9464
ENTRYPOINT ["matcher"]
CMD ["run"]

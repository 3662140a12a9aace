# The sageserve operator image: `sageserve operator` as a non-root user.
# Build (where a Docker engine exists): docker build -t ghcr.io/sageserve/sageserve:0.1.0 .
# Stage 1 builds a wheel and the dependencies' wheels; stage 2 installs only those.
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin sageserve
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels sageserve && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65532:65532
ENTRYPOINT ["sageserve"]
CMD ["operator"]

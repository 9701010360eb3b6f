# The Prometheus server of the alert e2e test on kind (`make e2e`); the local cluster packs the same
# binary without Docker (e2e/localcluster/images.sh). Built without its web UI: the test reads the
# HTTP API.
FROM golang:1.26 AS build
# Given by `make e2e` from e2e/localcluster/versions.env.
ARG PROMETHEUS_VERSION
RUN test -n "$PROMETHEUS_VERSION" && CGO_ENABLED=0 GOBIN=/out go install github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/prometheus /bin/prometheus
ENTRYPOINT ["/bin/prometheus"]

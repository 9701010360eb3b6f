# The S3-compatible store of the backup e2e tests on kind (`make e2e`); the local cluster packs the
# same binary without Docker (e2e/localcluster/images.sh).
FROM golang:1.26 AS build
# Given by `make e2e` from e2e/localcluster/versions.env.
ARG VERSITYGW_VERSION
RUN test -n "$VERSITYGW_VERSION" && CGO_ENABLED=0 GOBIN=/out go install github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/versitygw /usr/local/bin/versitygw
ENTRYPOINT ["/usr/local/bin/versitygw"]

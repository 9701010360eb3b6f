# The S3-compatible store of the backup e2e tests on kind (`make e2e`); the local cluster packs the
# same binary without Docker (e2e/localcluster/images.sh).
FROM golang:1.26 AS build
RUN CGO_ENABLED=0 GOBIN=/out go install github.com/versity/versitygw/cmd/versitygw@v1.8.0

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/versitygw /usr/local/bin/versitygw
ENTRYPOINT ["/usr/local/bin/versitygw"]

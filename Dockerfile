# The operator image: a static binary on distroless, non-root. The binary is built by `make build`,
# the same command the local test cluster's image is built with.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY Makefile ./
COPY apis/ apis/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY backup/ backup/
RUN make build

FROM gcr.io/distroless/static:nonroot
COPY --from=build /src/bin/kvcluster-operator /kvcluster-operator
USER 65532:65532
ENTRYPOINT ["/kvcluster-operator"]

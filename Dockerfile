# The operator image: a static binary on distroless, non-root. The binary is built by `make build`,
# the same command the local test cluster's image is built with.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
# The Makefile reads every pinned version from versions.env.
COPY Makefile ./
COPY e2e/localcluster/versions.env e2e/localcluster/
COPY apis/ apis/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY backup/ backup/
# The operator embeds its own manifests (deploy/manager, deploy/rbac).
COPY deploy/ deploy/
RUN make build

FROM gcr.io/distroless/static:nonroot
COPY --from=build /src/bin/kvcluster-operator /kvcluster-operator
USER 65532:65532
ENTRYPOINT ["/kvcluster-operator"]

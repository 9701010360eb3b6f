# The e2e suite's continuous writer on kind (`make e2e`); the local cluster packs the same program
# without Docker (e2e/localcluster/images.sh). Built from the repository root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/writer ./e2e/writer

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/writer /writer
ENTRYPOINT ["/writer"]

#!/usr/bin/env python3
"""A gRPC client of Envoy's rate limit service built from Envoy's own protos.

envoy/service/ratelimit/v3/rls.proto and the files it imports are compiled here with
grpcio-tools' protoc (into a temporary directory), then each request is sent with grpcio
through the generated stub, as any Python client of envoyproxy/ratelimit would.

    envoy_rls.py --protos PROTO_ROOT --target HOST:PORT [--ca CERT.pem] [--token T] < requests.json

PROTO_ROOT holds Envoy's data-plane-api, xds (udpa) and protoc-gen-validate protos (the
envoy-types crate ships them under proto/). The input is a JSON list of RateLimitRequest
messages in proto3 JSON; for each one, in order, one JSON line is printed:
{"response": <RateLimitResponse in proto3 JSON>} or {"error": {"code": "UNKNOWN",
"details": "..."}}.

Exit status: 0 when every call was answered (a gRPC error status is an answer), 2 when the
client libraries are missing, 3 when the protos do not compile, 4 on bad usage.
"""

import argparse
import json
import os
import re
import sys
import tempfile

INSTALL = (
    "install them into a virtual environment and point the tests at it:\n"
    "  python3 -m venv target/test-venv\n"
    "  target/test-venv/bin/pip install grpcio grpcio-tools\n"
    "  TURNSTILE_TEST_PYTHON=target/test-venv/bin/python cargo test ...\n"
    "(a relative TURNSTILE_TEST_PYTHON is taken from the workspace root)"
)

try:
    import grpc
    import grpc_tools
    from grpc_tools import protoc
    from google.protobuf import json_format
except ImportError as e:
    sys.stderr.write(
        f"envoy_rls.py: the Python gRPC client is missing ({e}) in {sys.executable}; {INSTALL}\n"
    )
    sys.exit(2)

ROOT = "envoy/service/ratelimit/v3/rls.proto"
# Where envoy-types keeps each set of protos, relative to PROTO_ROOT.
INCLUDES = ("data-plane-api", "xds", "protoc-gen-validate", "googleapis")
IMPORT = re.compile(r'^import\s+(?:public\s+|weak\s+)?"([^"]+)";', re.M)


def compile_protos(proto_root, out):
    """Compiles rls.proto and every file it imports (google/protobuf/* come with protoc)."""
    includes = [os.path.join(proto_root, d) for d in INCLUDES]
    builtin = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")

    def find(name):
        for inc in includes:
            path = os.path.join(inc, name)
            if os.path.isfile(path):
                return path
        return None

    todo, seen, files = [ROOT], set(), []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = find(name)
        if path is None:
            if os.path.isfile(os.path.join(builtin, name)):
                continue
            sys.stderr.write(f"envoy_rls.py: {name} not found under {proto_root}\n")
            sys.exit(3)
        files.append(name)
        with open(path, encoding="utf-8") as f:
            todo.extend(IMPORT.findall(f.read()))
    args = ["protoc", f"-I{builtin}", f"--python_out={out}", f"--grpc_python_out={out}"]
    args += [f"-I{inc}" for inc in includes if os.path.isdir(inc)]
    if protoc.main(args + sorted(files)) != 0:
        sys.stderr.write("envoy_rls.py: protoc failed on Envoy's protos\n")
        sys.exit(3)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--protos", required=True, help="the envoy-types crate's proto/ folder")
    p.add_argument("--target", required=True, help="HOST:PORT of the gRPC listener")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    p.add_argument("--ca", help="TLS: the PEM certificate to trust (the server's name: localhost)")
    p.add_argument("--token", help="sent as `authorization: Bearer TOKEN` metadata")
    a = p.parse_args()
    try:
        requests = json.load(sys.stdin)
    except ValueError as e:
        sys.stderr.write(f"envoy_rls.py: the requests on stdin are not JSON: {e}\n")
        sys.exit(4)
    with tempfile.TemporaryDirectory(prefix="envoy-rls-") as out:
        compile_protos(a.protos, out)
        sys.path.insert(0, out)
        from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

        if a.ca:
            with open(a.ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            channel = grpc.secure_channel(
                a.target, creds, options=[("grpc.ssl_target_name_override", "localhost")]
            )
        else:
            channel = grpc.insecure_channel(a.target)
        metadata = [("authorization", f"Bearer {a.token}")] if a.token else None
        with channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            for r in requests:
                req = json_format.ParseDict(r, rls_pb2.RateLimitRequest())
                try:
                    resp = stub.ShouldRateLimit(req, timeout=a.timeout, metadata=metadata)
                    line = {"response": json_format.MessageToDict(resp)}
                except grpc.RpcError as e:
                    line = {"error": {"code": e.code().name, "details": e.details()}}
                print(json.dumps(line, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()

#!/bin/sh
# The LMEvalJob driver's call through keyward gate, as deploy/e2e/kind.sh runs it in a driver
# pod (curl; the driver's own client is grpc-go, which tests/interop.rs runs): UpdateStatus at
# URL with the message DIR/own.bin (its own job), then DIR/other.bin (another job's), each
# answer's headers printed after a `CALL own` or `CALL other` line, `CALLS-DONE` at the end.
# The certificate, key and server CA are keyward's, from the environment its lmeval profile
# injects. tests/interop.rs runs this file against the gate and deploy/e2e/gate's stand-in;
# lib.sh's gate_check_verdict reads the output.
#   sh gate-check.sh URL DIR
set -u
url="$1"
dir="$2"
for call in own other; do
  echo "CALL $call"
  curl -sS --http2 --cacert "$GRPC_SERVER_CA" --cert "$GRPC_CLIENT_CERT" --key "$GRPC_CLIENT_KEY" \
    -H 'content-type: application/grpc' -H 'te: trailers' --data-binary "@$dir/$call.bin" \
    -D - -o /dev/null "$url" || echo "CURL-FAILED $?"
done
echo CALLS-DONE

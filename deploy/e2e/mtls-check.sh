#!/bin/sh
# An HTTP request over mutual TLS, as the LMEvalJob driver's gRPC client makes its calls: the
# server's chain and name are verified, the client certificate is presented, and the check
# passes only when the server *answers* (openssl s_server -www: "HTTP/1.0 200 ok"). A completed
# handshake proves nothing with TLS 1.3: the client finishes before the server has checked the
# client certificate, and a refusal arrives as an alert after it.
#
#   mtls-check.sh HOST PORT CERT KEY CA
#
# First each of CERT, KEY and CA must be a file that is not empty (FILES-PRESENT, or
# FILES-MISSING and exit 1).
#
# POSIX sh: it runs in the e2e driver pod (alpine) and in the offline test (tests/e2e_script.rs).
set -eu
[ "$#" -eq 5 ] || { echo "usage: mtls-check.sh HOST PORT CERT KEY CA" >&2; exit 2; }
host=$1 port=$2 cert=$3 key=$4 ca=$5
# The files keyward's injection points at, each present and not empty.
for file in "$cert" "$key" "$ca"; do
  [ -s "$file" ] || { echo "FILES-MISSING: $file is missing or empty" >&2; exit 1; }
done
echo "FILES-PRESENT"
response=$(printf 'GET / HTTP/1.0\r\n\r\n' | openssl s_client -quiet -connect "$host:$port" -servername "$host" \
  -verify_hostname "$host" -verify_return_error -cert "$cert" -key "$key" -CAfile "$ca" 2>/dev/null) || true
case "$response" in
  "HTTP/1.0 200 ok"*) echo "MTLS-OK: $host:$port answered over mutual TLS" ;;
  *) echo "MTLS-FAILED: $host:$port did not answer over mutual TLS (client certificate refused, or server not trusted)" >&2; exit 1 ;;
esac

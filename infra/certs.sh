#!/usr/bin/env bash
# Generate a throwaway certificate authority and the certificates a secured local run needs, in DIR.
#
#   bash infra/certs.sh DIR [PASSWORD]
#
# Writes (all PEM unless said otherwise):
#   ca.pem, ca.key                       the authority every client trusts
#   server.pem, server.key               for 127.0.0.1 / localhost (Kafka, Redis, the service)
#   client.pem, client.key               a client certificate signed by the same authority (mTLS)
#   server.p12, truststore.p12           PKCS12 key store and trust store for the JVM (Kafka's broker,
#                                        Flink's Kafka connector), protected by PASSWORD
#   password                             PASSWORD, for scripts that read it from a file
#
# For tests and local runs only: the authority's key sits next to its certificate and the validity is
# short (7 days). Production certificates come from the operator's own authority.
set -euo pipefail

dir="${1:?usage: certs.sh DIR [PASSWORD]}"
password="${2:-headwater-test}"
mkdir -p "$dir"
cd "$dir"
umask 077

days=7
subj="/O=headwater-test"

openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
  -keyout ca.key -out ca.pem -subj "$subj/CN=headwater test CA" >/dev/null 2>&1

# sign NAME CN EXT: a key and a certificate signed by the authority, with extension lines EXT.
sign() {
  local name="$1" cn="$2" ext="$3"
  openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$name.key" -out "$name.csr" \
    -subj "$subj/CN=$cn" >/dev/null 2>&1
  printf '%b\n' "$ext" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
    -sha256 -extfile "$name.ext" -out "$name.pem" >/dev/null 2>&1
  rm -f "$name.csr" "$name.ext"
}

sign server localhost "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth"
sign client headwater-client "extendedKeyUsage=clientAuth"

openssl pkcs12 -export -in server.pem -inkey server.key -certfile ca.pem -name server \
  -out server.p12 -passout "pass:$password" >/dev/null 2>&1
rm -f truststore.p12
keytool -importcert -noprompt -alias ca -file ca.pem -keystore truststore.p12 -storetype PKCS12 \
  -storepass "$password" >/dev/null 2>&1
printf '%s' "$password" > password
chmod 600 ./*.key password
echo "$dir"

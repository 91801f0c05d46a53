// CurveKeys: a cluster's control-plane key material for ZeroMQ CURVE (RFC 26), and the file
// that carries it from pw-cluster to its children.
//
// Two key pairs, each 40-character Z85 text (32-byte Curve25519 keys):
//   server: the ROUTER sockets (router, broker) prove with it that they are the cluster's;
//           clients refuse a server that does not hold its secret.
//   client: every process that connects (workers, the router's own wake-up socket) proves
//           with it that it belongs to the cluster; a server's ZAP handler accepts only this
//           public key. A connection without it never completes its handshake, so it never
//           gets a routing id on the server and can neither displace nor silence a worker.
// Both pairs are generated afresh by `pw-cluster up` for every run.
//
// File format (text, one "name: value" per line, '#' comments; written 0600, and a file that
// its group or others can read, or that another user owns, is refused on load):
//   server_public: <z85>
//   server_secret: <z85>
//   client_public: <z85>
//   client_secret: <z85>
// A pair's public key may be left out: it is derived from the secret (zmq_curve_public). A
// secret may also be 32 bytes in standard base64 (44 characters), as Helm's `randBytes 32`
// makes them: a chart generates the secrets and no public key (helm/pagedweight).
#pragma once

#include <string>

#include "common/status.h"

namespace pw::transport {

struct CurveKeyPair {
  std::string public_z85;  // 40 chars
  std::string secret_z85;  // 40 chars
};

struct CurveKeys {
  CurveKeyPair server;
  CurveKeyPair client;
};

// Two fresh key pairs (zmq_curve_keypair). Unsupported when libzmq lacks CURVE.
Result<CurveKeys> GenerateCurveKeys();
// Writes `keys` to `path` with mode 0600 (a temporary file in the same directory, then rename:
// the file never exists with wider permissions or half written).
Status WriteCurveKeys(const std::string& path, const CurveKeys& keys);
// Reads a file written by WriteCurveKeys, or one with secrets only (see above; the result then
// holds the derived public keys and the secrets in Z85). Errors name the file and the problem:
// missing, readable by group/others or owned by another user, a secret missing, a key not 40
// Z85 characters (a secret: nor 44 base64 ones of 32 bytes), or a secret that does not belong
// to its public key.
Result<CurveKeys> ReadCurveKeys(const std::string& path);

}  // namespace pw::transport

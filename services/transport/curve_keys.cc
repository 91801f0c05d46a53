#include "services/transport/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace pw::transport {

namespace {

constexpr size_t kZ85KeyChars = 40;

Status CheckZ85Key(const std::string& path, const std::string& name, const std::string& v) {
  uint8_t raw[32];
  if (v.size() != kZ85KeyChars || zmq_z85_decode(raw, v.c_str()) == nullptr) {
    return Corrupt(path + ": '" + name + "' is not a 40-character Z85 CURVE key");
  }
  return Status::Ok();
}

// 32 bytes from 44 characters of standard base64 (one '=' of padding); nullopt otherwise.
std::optional<std::string> Base64Key(const std::string& v) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (v.size() != 44 || v[43] != '=' || v[42] == '=') return std::nullopt;
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < 43; ++i) {
    const char* at = std::strchr(kAlphabet, v[i]);
    if (at == nullptr || v[i] == '\0') return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(at - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if ((acc & ((1u << bits) - 1)) != 0) return std::nullopt;  // non-canonical padding bits
  return out.size() == 32 ? std::optional<std::string>(out) : std::nullopt;
}

// A secret as given (Z85, or base64 turned into Z85).
Result<std::string> SecretZ85(const std::string& path, const std::string& name,
                              const std::string& v) {
  if (std::optional<std::string> raw = Base64Key(v)) {
    char z85[kZ85KeyChars + 1];
    zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(raw->data()), raw->size());
    return std::string(z85);
  }
  if (!CheckZ85Key(path, name, v).ok()) {
    return Corrupt(path + ": '" + name +
                   "' is not a 40-character Z85 CURVE key nor 32 bytes in base64");
  }
  return v;
}

// Checks `p` (its secret already Z85); an empty public key is derived from the secret.
Status CheckPair(const std::string& path, const std::string& which, CurveKeyPair& p) {
  if (!p.public_z85.empty()) PW_RETURN_IF_ERROR(CheckZ85Key(path, which + "_public", p.public_z85));
  char derived[kZ85KeyChars + 1];
  if (zmq_curve_public(derived, p.secret_z85.c_str()) != 0) {
    return Unsupported("libzmq was built without CURVE (zmq_has(\"curve\") is false)");
  }
  if (p.public_z85.empty()) {
    p.public_z85 = derived;
  } else if (p.public_z85 != derived) {
    return Corrupt(path + ": " + which + "_secret does not belong to " + which + "_public");
  }
  return Status::Ok();
}

Result<CurveKeyPair> NewPair() {
  char pub[kZ85KeyChars + 1], sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Unsupported(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()) +
                       " (libzmq without CURVE?)");
  }
  return CurveKeyPair{pub, sec};
}

}  // namespace

Result<CurveKeys> GenerateCurveKeys() {
  if (!zmq_has("curve")) {
    return Unsupported("libzmq was built without CURVE (zmq_has(\"curve\") is false)");
  }
  CurveKeys k;
  PW_ASSIGN_OR_RETURN(k.server, NewPair());
  PW_ASSIGN_OR_RETURN(k.client, NewPair());
  return k;
}

Status WriteCurveKeys(const std::string& path, const CurveKeys& keys) {
  std::string text =
      "# PagedWeight control-plane keys (ZeroMQ CURVE, Z85). Secret: keep this file 0600.\n"
      "server_public: " + keys.server.public_z85 + "\nserver_secret: " + keys.server.secret_z85 +
      "\nclient_public: " + keys.client.public_z85 + "\nclient_secret: " + keys.client.secret_z85 +
      "\n";
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return IoError("cannot create " + tmp + ": " + std::strerror(errno));
  // The umask can only narrow 0600; fchmod makes it exact.
  bool ok = fchmod(fd, 0600) == 0;
  size_t off = 0;
  while (ok && off < text.size()) {
    ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) off += static_cast<size_t>(n);
  }
  ok = ok && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    unlink(tmp.c_str());
    return IoError("cannot write " + path + ": " + std::strerror(e));
  }
  return Status::Ok();
}

Result<CurveKeys> ReadCurveKeys(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot open key file " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    return IoError("cannot stat " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return InvalidArgument(path + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    close(fd);
    std::ostringstream m;
    m << path << " is readable or writable by group or others (mode 0" << std::oct
      << (st.st_mode & 0777) << "); it holds secret keys: chmod 600 it";
    return InvalidArgument(m.str());
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    return InvalidArgument(path + " belongs to uid " + std::to_string(st.st_uid) +
                           ", not to this process's user (uid " + std::to_string(geteuid()) + ")");
  }
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > 65536) break;
  }
  close(fd);
  if (text.size() > 65536) return Corrupt(path + ": too large for a key file");
  std::map<std::string, std::string> kv;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) {
      return Corrupt(path + ":" + std::to_string(lineno) + ": expected 'name: value'");
    }
    std::string name = line.substr(0, colon);
    std::string value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.erase(0, 1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\r')) value.pop_back();
    kv[name] = value;
  }
  CurveKeys k;
  for (auto [name, field] : {std::pair{"server_secret", &k.server.secret_z85},
                             std::pair{"client_secret", &k.client.secret_z85}}) {
    auto it = kv.find(name);
    if (it == kv.end()) return Corrupt(path + ": '" + name + "' is missing");
    PW_ASSIGN_OR_RETURN(*field, SecretZ85(path, name, it->second));
  }
  // Public keys are optional (derived); one given is checked against its secret.
  for (auto [name, field] : {std::pair{"server_public", &k.server.public_z85},
                             std::pair{"client_public", &k.client.public_z85}}) {
    auto it = kv.find(name);
    if (it != kv.end()) {
      if (it->second.empty()) return Corrupt(path + ": '" + name + "' is empty");
      *field = it->second;
    }
  }
  PW_RETURN_IF_ERROR(CheckPair(path, "server", k.server));
  PW_RETURN_IF_ERROR(CheckPair(path, "client", k.client));
  return k;
}

}  // namespace pw::transport

#include "common/peer_id.h"

#include "common/logging.h"

namespace pw {

std::string PeerIdProblem(std::string_view id) {
  if (id.empty()) return "an id must not be empty";
  if (id.size() > kMaxPeerIdBytes) {
    return "id of " + std::to_string(id.size()) + " bytes (at most " + std::to_string(kMaxPeerIdBytes) + ")";
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\'' || c == '\\') {
      return "id '" + LogSafe(id) + "' has '" + LogSafe(id.substr(i, 1)) + "' at byte " + std::to_string(i) +
             " (ids are printable ASCII without spaces, quotes or backslashes)";
    }
  }
  return "";
}

}  // namespace pw

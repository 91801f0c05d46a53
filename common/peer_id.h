// The name a process goes by on the control plane: a worker's id, which is also its ZeroMQ
// routing id and the name of its section in the node file. Checked where an id is configured
// (the node file, a worker's --id) and where one arrives (the control server refuses a
// Register from a peer whose routing id is not one), so ids in log lines are plain text.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pw {

// Longest id: ZeroMQ's limit on a routing id.
inline constexpr size_t kMaxPeerIdBytes = 255;

// Empty when `id` is 1..kMaxPeerIdBytes bytes of printable ASCII other than space, quotes and
// backslash; else what is wrong with it (the id shown through LogSafe).
std::string PeerIdProblem(std::string_view id);

}  // namespace pw

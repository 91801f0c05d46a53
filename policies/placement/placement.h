// Placement: which decode worker and which prefill worker a request goes to, as a pure function
// of what the router knows of the workers (DESIGN.md 4: the router places a request on a
// prefill worker that computes its prompt's KV and a decode worker that reserved room for it).
// The router gathers the candidates from its peers' registrations and heartbeats and its own
// requests, and applies the choice (services/router/cluster_backend.cc); a simulator or a test
// runs the same function on made-up candidates.
//
// Decode: among workers not draining, reachable, with a free batch slot, prefer one the request
// has not failed on, then the most free KV blocks (less the blocks of requests placed too
// recently for a heartbeat to show them), then the fewest requests of ours.
// Prefill: among workers not draining, reachable, whose KV layout is the chosen decode worker's,
// prefer one the request has not failed on, then the one another request of its group went to
// (it computes the shared prompt once), then one on the decode worker's node (the KV transfer
// stays inside the host: shared memory, not the network) unless its queue is longer than the
// shortest by more than `same_node_slack_tokens` (load spreads to other nodes), then the
// shortest queue of prompt tokens. A node lost takes its workers out as unreachable: the
// request is placed across nodes on the others.
// Ties keep the first candidate in the order given.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace pw::placement {

struct DecodeCandidate {
  std::string id;
  bool draining = false;
  bool reachable = true;
  bool failed_before = false;   // the request already failed on this worker
  int64_t assigned = 0;         // requests of ours placed on it
  int64_t max_assigned = 0;     // its batch slots plus how many may wait ahead of them
  int64_t free_kv_blocks = 0;   // from its last heartbeat (before the first: its registered pool)
  int64_t recent_blocks = 0;    // blocks of requests placed after that heartbeat
  uint64_t layout_hash = 0;
  std::string node;             // the node it registered on; empty: unknown, shares none
};

struct PrefillCandidate {
  std::string id;
  bool draining = false;
  bool reachable = true;
  bool failed_before = false;
  bool group_peer = false;       // another request of this one's group went here
  int64_t queued_tokens = 0;     // prompt tokens queued (heartbeat) plus ours being prefilled
  uint64_t layout_hash = 0;
  std::string node;              // as DecodeCandidate::node
};

// How many more queued prompt tokens than the shortest queue a prefill worker on the decode
// worker's node may have and still be preferred: about one long prompt's prefill, less than
// moving its KV across the network costs.
inline constexpr int64_t kSameNodeSlackTokens = 2048;

struct Choice {
  size_t decode = 0;   // index into the decode candidates
  size_t prefill = 0;  // index into the prefill candidates
};

// The pair for one request; nullopt when no decode worker has room or no prefill worker
// matches the chosen decode worker's layout.
std::optional<Choice> Place(std::span<const DecodeCandidate> decode,
                            std::span<const PrefillCandidate> prefill,
                            int64_t same_node_slack_tokens = kSameNodeSlackTokens);

}  // namespace pw::placement

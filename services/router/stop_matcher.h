// StopMatcher: applies OpenAI `stop` sequences to a stream of text.
//
// Contract: the concatenation of everything Push() and Flush() return equals the generated
// text cut just before the first stop sequence to complete (generation stops as soon as one
// appears; among those completing at the same byte, the one starting first); the stop sequence
// itself is never returned. While streaming, the longest tail that could still begin a stop
// sequence is held back, so a stop sequence split across tokens is still caught. Texts are whole
// UTF-8 characters (from TextDecoder), so the held tail never splits a character.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pw::router {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Appends `text`; returns the part that is now safe to send. After a match, returns the text
  // before the match once and sets stopped(); later calls return "".
  std::string Push(std::string_view text);
  // End of generation: returns whatever is still held (no stop sequence can complete now).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // text received but not yet returned
  bool stopped_ = false;
};

}  // namespace pw::router

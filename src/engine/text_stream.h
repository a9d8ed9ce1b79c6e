// Turns generated token pieces into text that is safe to emit: a full stop-string match ends the
// stream and is cut from the text; a partial match at the end is held back; a multi-byte UTF-8
// character is never split. Pure; one per request.
#pragma once

#include <string>
#include <vector>

namespace specrpc {

class TextStream {
  public:
    explicit TextStream(std::vector<std::string> stop_words);

    // Appends `piece`; returns the newly emittable text (possibly empty).
    std::string push(const std::string & piece);
    // End of generation: returns everything still held back (a partial stop match is real text).
    std::string flush();

    bool                stopped() const { return stopped_; }   // a stop word matched
    const std::string & stop_word() const { return stop_word_; }
    const std::string & text() const { return all_; }          // full text so far, stop word cut

  private:
    size_t partial_stop_len() const;  // longest suffix of all_ that is a proper prefix of a stop word

    std::vector<std::string> stops_;
    size_t                   max_stop_ = 0;
    std::string              all_;
    size_t                   sent_ = 0;
    bool                     stopped_ = false;
    std::string              stop_word_;
};

// Number of bytes at the end of `s` that form an incomplete UTF-8 sequence (0..3).
size_t utf8_incomplete_tail(const std::string & s);

}  // namespace specrpc

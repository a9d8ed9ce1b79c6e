#include "engine/text_stream.h"

#include <algorithm>

namespace specrpc {

size_t utf8_incomplete_tail(const std::string & s) {
    // Walk back over at most 3 continuation bytes to the lead byte and compare the sequence length
    // it announces with what is there.
    size_t n = s.size();
    for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
        unsigned char c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte
        size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

TextStream::TextStream(std::vector<std::string> stop_words) : stops_(std::move(stop_words)) {
    stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
    for (const auto & s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

size_t TextStream::partial_stop_len() const {
    size_t best = 0;
    for (const auto & s : stops_) {
        for (size_t len = std::min(s.size() - 1, all_.size()); len > best; --len)
            if (all_.compare(all_.size() - len, len, s, 0, len) == 0) { best = len; break; }
    }
    return best;
}

std::string TextStream::push(const std::string & piece) {
    if (stopped_) return {};
    size_t old_size = all_.size();
    all_ += piece;
    if (!stops_.empty()) {
        // A new match must end inside the new piece: start the search max_stop_ bytes earlier.
        size_t from = old_size > max_stop_ ? old_size - max_stop_ : 0;
        size_t best = std::string::npos;
        for (const auto & s : stops_) {
            size_t pos = all_.find(s, from);
            if (pos != std::string::npos && pos < best) { best = pos; stop_word_ = s; }
        }
        if (best != std::string::npos) {
            stopped_ = true;
            all_.resize(best);
            if (sent_ > all_.size()) sent_ = all_.size();  // cannot happen: held back as partial
            std::string out = all_.substr(sent_);
            sent_ = all_.size();
            return out;
        }
    }
    size_t end = all_.size() - partial_stop_len();
    end -= utf8_incomplete_tail(all_.substr(0, end));
    if (end <= sent_) return {};
    std::string out = all_.substr(sent_, end - sent_);
    sent_ = end;
    return out;
}

std::string TextStream::flush() {
    std::string out = all_.substr(sent_);
    sent_ = all_.size();
    return out;
}

}  // namespace specrpc

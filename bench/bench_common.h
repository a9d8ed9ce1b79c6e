// What the benchmarks share: the prompts and how a model is named in the tables.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace specrpc::bench {

// The 10 openings of ../shared/models/MANIFEST.md (TinyStories style).
inline const std::vector<std::string> kPrompts = {
    "Once upon a time",       "Lily wanted to",          "The little dog",
    "Tom and Sue went to the park", "One day, a big bear", "Ben had a red ball. He",
    "Mia and her mom baked a cake.", "There was a small bird in a tree.", "The sun was shining and",
    "Max found a shiny stone"};

// "stories260K-x100M-Q8_0.gguf" -> "x100M-Q8_0" (and "stories260K.gguf" -> "260K").
inline std::string short_name(const std::string & file) {
    std::string s = file;
    if (s.rfind("stories260K-", 0) == 0) s = s.substr(12);
    if (s.size() > 5 && s.substr(s.size() - 5) == ".gguf") s.resize(s.size() - 5);
    return s.empty() ? "260K" : s;
}

// The median of v (the mean of the middle two for an even count); 0 when empty.
inline double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace specrpc::bench

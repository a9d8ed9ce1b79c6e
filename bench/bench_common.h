// The benchmark prompts: the 10 openings of ../shared/models/MANIFEST.md (TinyStories style).
#pragma once

#include <string>
#include <vector>

namespace specrpc::bench {

inline const std::vector<std::string> kPrompts = {
    "Once upon a time",       "Lily wanted to",          "The little dog",
    "Tom and Sue went to the park", "One day, a big bear", "Ben had a red ball. He",
    "Mia and her mom baked a cake.", "There was a small bird in a tree.", "The sun was shining and",
    "Max found a shiny stone"};

}  // namespace specrpc::bench

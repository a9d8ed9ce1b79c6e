// Small string helpers shared by the transports.
#pragma once

#include <cctype>
#include <string_view>

namespace specrpc {

// True if `s` begins with `prefix`, ASCII case-insensitively (HTTP header names, framing).
inline bool starts_with_nocase(std::string_view s, std::string_view prefix) {
    if (s.size() < prefix.size()) return false;
    for (std::size_t i = 0; i < prefix.size(); i++)
        if (std::tolower(static_cast<unsigned char>(s[i])) != std::tolower(static_cast<unsigned char>(prefix[i])))
            return false;
    return true;
}

// True if `a` equals `b`, ASCII case-insensitively.
inline bool equals_nocase(std::string_view a, std::string_view b) {
    return a.size() == b.size() && starts_with_nocase(a, b);
}

}  // namespace specrpc

// The `slot_action` method: llama-server's POST /slots/:id_slot?action=save|restore|erase, over
// the engine's slot files (Engine::save_slot / restore_slot / erase_slot).
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>

#include "server/service.h"

namespace specrpc::server {

namespace {

// A file name inside --slot-save-path, never a path: no separators, no "..", no characters some
// file system rejects or rewrites (so the same name means the same file everywhere), valid UTF-8
// without control characters, at most 255 bytes.
bool valid_slot_filename(const std::string & f) {
    if (f.empty() || f.size() > 255 || f == "." || f.find("..") != std::string::npos) return false;
    if (f.front() == ' ' || f.back() == ' ' || f.back() == '.') return false;
    for (size_t i = 0; i < f.size();) {
        const unsigned char c = static_cast<unsigned char>(f[i]);
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7F || std::string_view("/\\:*?\"<>|").find(static_cast<char>(c)) != std::string_view::npos)
                return false;
            ++i;
            continue;
        }
        const size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (n == 0 || i + n > f.size()) return false;
        uint32_t cp = c & (0xFF >> (n + 1));
        for (size_t k = 1; k < n; ++k) {
            const unsigned char d = static_cast<unsigned char>(f[i + k]);
            if ((d & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (d & 0x3F);
        }
        // overlong forms, C1 controls, surrogates, and look-alikes of '.', '/' and '\'
        if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF) return false;
        if ((cp >= 0x80 && cp <= 0x9F) || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0xFF0E || cp == 0x2215 ||
            cp == 0x2216 || cp == 0xFFFD || cp == 0xFEFF)
            return false;
        i += n;
    }
    return true;
}

}  // namespace

rpc::MethodResult Service::slot_action(const json & params, rpc::CallContext &) {
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    std::string dir;
    {
        std::lock_guard<std::mutex> lock(mu_);
        dir = slot_save_path_;
    }
    // the slot id: a number, or the route's path segment (a string)
    int64_t id = -1;
    auto it = params.find("id_slot");
    if (it == params.end() || it->is_null()) return rpc::invalid_params("id_slot is required", "id_slot");
    if (it->is_number_integer()) id = it->get<int64_t>();
    else if (it->is_string()) {
        const std::string & s = it->get_ref<const std::string &>();
        char * end = nullptr;
        errno = 0;
        id = s.empty() ? -1 : std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno != 0) return rpc::invalid_params("Invalid slot ID: " + s, "id_slot");
    } else {
        return rpc::invalid_params("id_slot must be an integer", "id_slot");
    }
    if (id < 0 || id > INT32_MAX) return rpc::invalid_params("Invalid slot ID: " + std::to_string(id), "id_slot");
    const auto ait = params.find("action");
    if (ait == params.end() || !ait->is_string())
        return rpc::invalid_params("action is required: save, restore or erase", "action");
    const std::string action = ait->get<std::string>();
    if (action != "save" && action != "restore" && action != "erase")
        return rpc::invalid_params("Invalid action: " + action + " (save, restore or erase)", "action");
    if (dir.empty())
        return rpc::make_error(rpc::ERR_UNSUPPORTED,
                               "This server does not support slots action. Start it with `--slot-save-path`");

    auto eng = engine();
    if (!eng) return not_ready_error();
    const int32_t slot = static_cast<int32_t>(id);
    if (action == "erase") {
        auto n = eng->erase_slot(slot);
        if (!n) return rpc::error_from_status(n.status());
        return json{{"id_slot", slot}, {"n_erased", n.value()}};
    }

    const auto fit = params.find("filename");
    if (fit == params.end() || !fit->is_string()) return rpc::invalid_params("filename is required (a string)", "filename");
    const std::string filename = fit->get<std::string>();
    if (!valid_slot_filename(filename))
        return rpc::invalid_params("Invalid filename: a file name inside --slot-save-path, without '/', '\\' or '..'",
                                   "filename");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // as llama-server, which creates it at start-up
    const std::string path = (std::filesystem::path(dir) / filename).string();
    const bool save = action == "save";
    auto r = save ? eng->save_slot(slot, path) : eng->restore_slot(slot, path);
    if (!r) return rpc::error_from_status(r.status());
    const SlotFileResult & v = r.value();
    if (save)
        return json{{"id_slot", v.id_slot}, {"filename", filename}, {"n_saved", v.n_tokens},
                    {"n_written", v.n_bytes}, {"timings", {{"save_ms", v.t_ms}}}};
    return json{{"id_slot", v.id_slot}, {"filename", filename}, {"n_restored", v.n_tokens},
                {"n_read", v.n_bytes}, {"timings", {{"restore_ms", v.t_ms}}}};
}

}  // namespace specrpc::server

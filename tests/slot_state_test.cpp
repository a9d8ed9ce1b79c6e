// Slot files and idle sleep through the C++ API (Engine::save_slot / restore_slot / erase_slot,
// EngineParams::sleep_idle_seconds) on real models: a restored slot continues its cache with the
// same greedy text, llama-server's plain token list files restore, errors leave the slot usable,
// and an engine that slept answers as before.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;

namespace {

std::string temp_file(const char * name) {
    return (std::filesystem::temp_directory_path() / (std::string("specrpc-slot-") + std::to_string(::getpid()) + "-" + name)).string();
}

CompletionRequest in_slot(const Engine & e, const std::string & prompt, int32_t n, int32_t slot) {
    CompletionRequest r = greedy_request(e, prompt, n);
    r.id_slot = slot;
    return r;
}

const char * kPrompt = "Once upon a time, there was a little girl";

}  // namespace

TEST(SlotState, RestoredSlotContinuesItsCache) {
    auto e = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf", 2, 256);
    ASSERT_TRUE(e);
    auto first = e->complete(in_slot(*e, kPrompt, 24, 0));
    ASSERT_TRUE(first.is_ok());
    EXPECT_EQ(first.value().slot_id, 0);
    const std::string path = temp_file("a.bin");
    auto saved = e->save_slot(0, path);
    ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
    const int32_t n_prompt = first.value().tokens_evaluated;
    EXPECT_EQ(saved.value().n_tokens, n_prompt + 24 - 1);  // the last generated token is not in the KV
    EXPECT_GT(saved.value().n_bytes, 0u);

    ASSERT_TRUE(e->complete(in_slot(*e, "The dog ran", 8, 1)).is_ok());
    auto restored = e->restore_slot(1, path);
    ASSERT_TRUE(restored.is_ok()) << restored.status().to_string();
    EXPECT_EQ(restored.value().n_tokens, saved.value().n_tokens);
    EXPECT_EQ(restored.value().n_bytes, saved.value().n_bytes);

    auto again = e->complete(in_slot(*e, kPrompt, 24, 1));
    ASSERT_TRUE(again.is_ok());
    EXPECT_EQ(again.value().slot_id, 1);
    EXPECT_EQ(again.value().tokens_cached, n_prompt - 1);
    EXPECT_EQ(again.value().content, first.value().content);

    auto erased = e->erase_slot(1);
    ASSERT_TRUE(erased.is_ok());
    EXPECT_GT(erased.value(), 0);
    EXPECT_EQ(e->complete(in_slot(*e, kPrompt, 4, 1)).value().tokens_cached, 0);
    std::remove(path.c_str());
}

// llama-server's older files carry a plain token list where the packed form is now: rewrite a
// saved file that way, as llama-server's own test does, and restore it.
TEST(SlotState, PlainTokenListFilesRestore) {
    auto e = make_engine("stories260K-F32.gguf", "", 1, 256);
    ASSERT_TRUE(e);
    auto first = e->complete(in_slot(*e, kPrompt, 16, 0));
    ASSERT_TRUE(first.is_ok());
    const std::string path = temp_file("legacy.bin");
    auto saved = e->save_slot(0, path);
    ASSERT_TRUE(saved.is_ok());
    std::string data;
    {
        std::ifstream f(path, std::ios::binary);
        data.assign(std::istreambuf_iterator<char>(f), {});
    }
    // magic, version, payload words; payload: LLAMA_TOKEN_NULL, version, n, tokens, n_media
    uint32_t n_words = 0, n = 0;
    std::memcpy(&n_words, data.data() + 8, 4);
    std::memcpy(&n, data.data() + 20, 4);
    ASSERT_EQ(static_cast<int32_t>(n), saved.value().n_tokens);
    ASSERT_EQ(n_words, n + 4);
    std::string legacy = data.substr(0, 12) + data.substr(24, n * 4) + data.substr(12 + n_words * 4);
    std::memcpy(legacy.data() + 8, &n, 4);
    {
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        f.write(legacy.data(), static_cast<std::streamsize>(legacy.size()));
    }
    ASSERT_TRUE(e->erase_slot(0).is_ok());
    auto restored = e->restore_slot(0, path);
    ASSERT_TRUE(restored.is_ok()) << restored.status().to_string();
    EXPECT_EQ(restored.value().n_tokens, saved.value().n_tokens);
    auto again = e->complete(in_slot(*e, kPrompt, 16, 0));
    EXPECT_EQ(again.value().tokens_cached, first.value().tokens_evaluated - 1);
    EXPECT_EQ(again.value().content, first.value().content);
    std::remove(path.c_str());
}

TEST(SlotState, ErrorsLeaveTheSlotUsable) {
    auto e = make_engine("stories260K-F32.gguf", "", 2, 256);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->save_slot(2, temp_file("x.bin")).status().code(), ErrorCode::NOT_FOUND);
    EXPECT_EQ(e->save_slot(-1, temp_file("x.bin")).status().code(), ErrorCode::NOT_FOUND);
    EXPECT_EQ(e->erase_slot(7).status().code(), ErrorCode::NOT_FOUND);
    EXPECT_EQ(e->restore_slot(0, temp_file("missing.bin")).status().code(), ErrorCode::NOT_FOUND);
    EXPECT_EQ(e->save_slot(0, "/nonexistent-dir/x.bin").status().code(), ErrorCode::INTERNAL);
    const std::string junk = temp_file("junk.bin");
    {
        std::ofstream f(junk, std::ios::binary);
        f << "definitely not a sequence state file";
    }
    ASSERT_TRUE(e->complete(in_slot(*e, kPrompt, 8, 0)).is_ok());
    auto r = e->restore_slot(0, junk);
    EXPECT_EQ(r.status().code(), ErrorCode::INVALID_ARGUMENT);
    // the slot was emptied, not left half-restored, and it still serves
    auto after = e->complete(in_slot(*e, kPrompt, 8, 0));
    ASSERT_TRUE(after.is_ok());
    EXPECT_EQ(after.value().tokens_cached, 0);
    // a request for a slot that does not exist
    EXPECT_EQ(e->complete(in_slot(*e, kPrompt, 8, 2)).status().code(), ErrorCode::INVALID_ARGUMENT);
    std::remove(junk.c_str());
}

TEST(SlotState, SleepFreesAndWakesTheModels) {
    EngineParams p = engine_params("stories260K-F32.gguf", "stories260K-Q8_0.gguf");
    p.n_ctx              = 256;
    p.sleep_idle_seconds = 1;
    auto made = Engine::create(p);
    ASSERT_TRUE(made.is_ok());
    Engine & e = *made.value();
    auto before = e.complete(greedy_request(e, kPrompt, 16));
    ASSERT_TRUE(before.is_ok());
    const auto toks = e.tokenize(kPrompt, true, false).value();
    auto wait_sleep = [&] {
        for (int i = 0; i < 200 && !e.is_sleeping(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return e.is_sleeping();
    };
    ASSERT_TRUE(wait_sleep());
    EXPECT_EQ(e.metrics().tokens_predicted, 16);  // metrics need no model
    EXPECT_TRUE(e.is_sleeping());
    EXPECT_EQ(e.tokenize(kPrompt, true, false).value(), toks);  // wakes the models
    EXPECT_FALSE(e.is_sleeping());
    ASSERT_TRUE(wait_sleep());
    CompletionRequest r = greedy_request(e, kPrompt, 16);  // tokenize wakes the models ...
    ASSERT_TRUE(wait_sleep());                            // ... let them sleep again
    auto after = e.complete(std::move(r));                // and the request wakes them
    ASSERT_TRUE(after.is_ok());
    EXPECT_FALSE(e.is_sleeping());
    EXPECT_EQ(after.value().content, before.value().content);
    EXPECT_EQ(after.value().tokens_cached, 0);  // the KV went with the contexts
}

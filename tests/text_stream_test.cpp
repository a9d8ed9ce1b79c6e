// Stop strings (full match ends and is cut, partial match held back) and UTF-8 hold-back.
#include <gtest/gtest.h>

#include "engine/text_stream.h"

using specrpc::TextStream;
using specrpc::utf8_incomplete_tail;

TEST(TextStream, FullStopMatchEndsAndIsCut) {
    TextStream ts({"END"});
    std::string out = ts.push("Hello ");
    out += ts.push("wor");
    out += ts.push("ld EN");
    EXPECT_FALSE(ts.stopped());
    out += ts.push("D and more");
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(ts.stop_word(), "END");
    EXPECT_EQ(out, "Hello world ");
    EXPECT_EQ(ts.text(), "Hello world ");
    EXPECT_EQ(ts.push("ignored"), "");
}

TEST(TextStream, PartialMatchIsHeldBackThenReleased) {
    TextStream ts({"<stop>"});
    EXPECT_EQ(ts.push("abc<st"), "abc");
    EXPECT_EQ(ts.push("o"), "");
    EXPECT_EQ(ts.push("x"), "<stox");  // not a stop after all
    EXPECT_EQ(ts.push("<"), "");
    EXPECT_EQ(ts.flush(), "<");        // end of generation: held text is real text
    EXPECT_FALSE(ts.stopped());
}

TEST(TextStream, EarliestOfSeveralStopsWins) {
    TextStream ts({"world", "lo w"});
    std::string out = ts.push("hello world");
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(ts.stop_word(), "lo w");
    EXPECT_EQ(out, "hel");
}

TEST(TextStream, StopSpanningManyPieces) {
    TextStream ts({"\n\n"});
    std::string out;
    for (const char * p : {"a", "\n", "\n", "b"}) out += ts.push(p);
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(out, "a");
}

TEST(TextStream, Utf8NeverSplit) {
    TextStream ts({});
    const std::string zurich = "Z\xC3\xBCrich \xE2\x98\x83 \xF0\x9F\x98\x80";  // Zürich ☃ 😀
    std::string out;
    for (char c : zurich) {
        std::string piece = ts.push(std::string(1, c));
        // every emitted piece is complete UTF-8
        EXPECT_EQ(utf8_incomplete_tail(out + piece), 0u);
        out += piece;
    }
    out += ts.flush();
    EXPECT_EQ(out, zurich);
}

TEST(TextStream, IncompleteTailDetection) {
    EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("a\xC3"), 1u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE2\x98"), 2u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE2\x98\x83"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98"), 3u);
}

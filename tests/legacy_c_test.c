/* The existing rpcserver library's contract (shared/legacy/rpcserver.cpp), checked the way its
 * callers use it: only rpcserver.h, its return codes (init: 0 = success, 1 = failure), its JSON
 * key types (init_success an integer, tokens the pieces as strings, the keys of
 * format_final_response / format_generation_settings / format_timings / loadPrompt's
 * prompt_stats / format_partial_response), free() on every returned string, init from a command
 * line whose first word is the program name (its parse_args/server_params_parse) and from JSON
 * (with its server_params keys), init_async polled until init_success == 1, completions, a
 * stream through async init/poll/cancel, any n_predict. Linked to the shared library. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "c_check.h"
#include "specrpc/rpcserver.h"

/* ---- a tiny JSON reader: enough to find a key and tell its type ------------------------------- */

static const char * ws(const char * p) {
    while (p && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* Returns the end of the value starting at p (after whitespace), or NULL if malformed. */
static const char * skip_value(const char * p) {
    p = ws(p);
    if (!p) return NULL;
    if (*p == '"') {
        for (p++; *p && *p != '"'; p++)
            if (*p == '\\' && p[1]) p++;
        return *p == '"' ? p + 1 : NULL;
    }
    if (*p == '{' || *p == '[') {
        const char close = *p == '{' ? '}' : ']';
        p = ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (close == '}') {
                p = skip_value(p); /* the key */
                if (!p) return NULL;
                p = ws(p);
                if (*p != ':') return NULL;
                p++;
            }
            p = skip_value(p);
            if (!p) return NULL;
            p = ws(p);
            if (*p == ',') { p++; continue; }
            return *p == close ? p + 1 : NULL;
        }
    }
    if (!strncmp(p, "true", 4)) return p + 4;
    if (!strncmp(p, "false", 5)) return p + 5;
    if (!strncmp(p, "null", 4)) return p + 4;
    const char * q = p;
    if (*q == '-') q++;
    if (*q < '0' || *q > '9') return NULL;
    while ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-') q++;
    return q;
}

/* The value of `key` in the object starting at `obj`, or NULL. */
static const char * get(const char * obj, const char * key) {
    const char * p = ws(obj);
    if (!p || *p != '{') return NULL;
    p = ws(p + 1);
    size_t kl = strlen(key);
    while (*p == '"') {
        const char * k = p + 1;
        const char * kend = skip_value(p);
        if (!kend) return NULL;
        p = ws(kend);
        if (*p != ':') return NULL;
        const char * v = ws(p + 1);
        if ((size_t)(kend - 1 - k) == kl && !strncmp(k, key, kl)) return v;
        p = skip_value(v);
        if (!p) return NULL;
        p = ws(p);
        if (*p == ',') p = ws(p + 1);
    }
    return NULL;
}

/* The type of the value at v: 'o' object, 'a' array, 's' string, 'i' integer, 'd' other number,
 * 'b' boolean, 'z' null, '?' missing or malformed. */
static char type_of(const char * v) {
    if (!v) return '?';
    const char * end = skip_value(v);
    if (!end) return '?';
    switch (*v) {
        case '{': return 'o';
        case '[': return 'a';
        case '"': return 's';
        case 't': case 'f': return 'b';
        case 'n': return 'z';
    }
    for (const char * q = v; q < end; q++)
        if (*q == '.' || *q == 'e' || *q == 'E') return 'd';
    return 'i';
}

/* Checks that `obj` has each "key:T" of `spec` (T as type_of; 'n' = any number). */
static void expect_keys(const char * what, const char * obj, const char * const * spec) {
    for (; *spec; spec++) {
        char key[64];
        const char * colon = strchr(*spec, ':');
        snprintf(key, sizeof key, "%.*s", (int)(colon - *spec), *spec);
        const char want = colon[1];
        const char t = type_of(get(obj, key));
        const int ok = want == 'n' ? (t == 'i' || t == 'd') : t == want;
        CHECK(ok, "%s: key \"%s\" should be of type %c, is %c", what, key, want, t);
    }
}

static long get_int(const char * obj, const char * key) {
    const char * v = get(obj, key);
    return type_of(v) == 'i' ? strtol(v, NULL, 10) : -999999;
}
static int is_true(const char * obj, const char * key) {
    const char * v = get(obj, key);
    return v && !strncmp(v, "true", 4);
}

/* Appends the string value at v (escapes kept) to out. */
static void append_string(const char * v, char * out, size_t cap) {
    if (type_of(v) != 's') return;
    size_t n = strlen(out);
    for (const char * p = v + 1; *p && *p != '"'; p++) {
        if (*p == '\\' && p[1] && n + 2 < cap) { out[n++] = *p++; out[n++] = *p; continue; }
        if (n + 1 < cap) out[n++] = *p;
    }
    out[n] = '\0';
}

/* ---- the keys of the existing library's answers -------------------------------------------- */

static const char * const kStatusKeys[] = {"init_success:i", "model_alias:s", "model:s", NULL};
static const char * const kFinalKeys[] = {
    "content:s", "stop:b", "model:s", "tokens_predicted:i", "tokens_evaluated:i", "generation_settings:o",
    "truncated:b", "stopped_eos:b", "stopped_word:b", "stopped_limit:b", "stopping_word:s", "tokens_cached:i",
    "timings:o", "status:i", NULL};
static const char * const kSettingsKeys[] = {
    "n_ctx:i", "model:s", "seed:i", "temp:n", "top_k:i", "top_p:n", "tfs_z:n", "typical_p:n", "repeat_last_n:i",
    "repeat_penalty:n", "presence_penalty:n", "frequency_penalty:n", "mirostat:i", "mirostat_tau:n",
    "mirostat_eta:n", "penalize_nl:b", "stop:a", "n_predict:i", "n_keep:i", "ignore_eos:b", "stream:b",
    "logit_bias:a", "n_probs:i", "grammar:s", NULL};
static const char * const kTimingsKeys[] = {
    "prompt_n:i", "prompt_ms:n", "prompt_per_token_ms:n", "prompt_per_second:n",
    "predicted_n:i", "predicted_ms:n", "predicted_per_token_ms:n", "predicted_per_second:n", NULL};
static const char * const kPromptStatsKeys[] = {
    "n_ctx:i", "total_prompt_tokens:i", "truncated:b", "n_past:i", "cached:s", "to_eval:s", NULL};
static const char * const kChunkKeys[] = {"content:s", "stop:b", NULL};

static void expect_final(const char * what, const char * r) {
    char label[128];
    expect_keys(what, r, kFinalKeys);
    snprintf(label, sizeof label, "%s.generation_settings", what);
    expect_keys(label, get(r, "generation_settings"), kSettingsKeys);
    snprintf(label, sizeof label, "%s.timings", what);
    expect_keys(label, get(r, "timings"), kTimingsKeys);
    CHECK(get_int(r, "status") == 200, "%s: status 200", what);
}

/* completion_probabilities: [{"content": piece, "probs": [{"tok_str": piece, "prob": p}, ...]}] */
static void expect_probs(const char * what, const char * r, int n_probs) {
    const char * a = get(r, "completion_probabilities");
    CHECK(type_of(a) == 'a', "%s: completion_probabilities: %.200s", what, a ? a : "(missing)");
    if (type_of(a) != 'a' || a[1] == ']') return;
    const char * first = ws(a + 1);
    CHECK(type_of(get(first, "content")) == 's', "%s: probs[0].content", what);
    const char * probs = get(first, "probs");
    CHECK(type_of(probs) == 'a', "%s: probs[0].probs", what);
    if (type_of(probs) != 'a') return;
    int n = 0;
    for (const char * p = ws(probs + 1); *p == '{'; n++) {
        CHECK(type_of(get(p, "tok_str")) == 's' && type_of(get(p, "prob")) != '?', "%s: probs entry %.100s", what, p);
        p = ws(skip_value(p));
        if (*p == ',') p = ws(p + 1);
    }
    CHECK(n == n_probs, "%s: %d probs, want %d", what, n, n_probs);
}

/* ---- the flow ------------------------------------------------------------------------------- */

static char g_model[1024];

static void tokenize_twice(void) {
    /* the existing library's callers free what tokenize returns, call after call */
    for (int i = 0; i < 3; i++) {
        char * r = (char *)tokenize("{\"text\":\"Once upon a time\"}");
        CHECK(r && is_true(r, "success"), "tokenize: %s", r ? r : "(null)");
        const char * toks = get(r, "tokens");
        CHECK(type_of(toks) == 'a', "tokens is an array: %s", r);
        CHECK(get_int(r, "length") == 5, "length 5 (BOS + 4 pieces): %s", r);
        if (type_of(toks) == 'a') {
            /* pieces as strings, BOS first */
            const char * t0 = ws(toks + 1);
            CHECK(type_of(t0) == 's', "tokens[0] is a string: %s", r);
            CHECK(strstr(toks, "\" upon\"") != NULL, "the piece \" upon\": %s", r);
        }
        free(r);
    }
}

/* Streams one completion through async init/poll; returns the text; *final_seen: a stop chunk. */
static void stream(const char * req, char * text, size_t cap, int cancel_after_first, int * cancelled_ok) {
    text[0] = '\0';
    char * r = (char *)async_completion_init(req);
    CHECK(r && is_true(r, "success"), "async init: %s", r ? r : "(null)");
    CHECK(type_of(get(r, "prompt_stats")) == 'o', "async init prompt_stats: %s", r ? r : "(null)");
    if (type_of(get(r, "prompt_stats")) == 'o') expect_keys("async prompt_stats", get(r, "prompt_stats"), kPromptStatsKeys);
    free(r);
    int finished = 0, stop_chunk = 0, polls = 0, cancelled = 0;
    double t0 = now_s();
    while (!finished && now_s() - t0 < 60) {
        char * p = (char *)async_completion_poll("{}");
        polls++;
        CHECK(p && is_true(p, "success"), "poll success: %.300s", p ? p : "(null)");
        CHECK(type_of(get(p, "finished")) == 'b', "poll finished is a boolean: %.300s", p ? p : "(null)");
        const char * u = get(p, "completion_updates");
        CHECK(type_of(u) == 'a', "completion_updates is an array: %.300s", p ? p : "(null)");
        if (type_of(u) == 'a') {
            for (const char * c = ws(u + 1); *c == '{';) {
                expect_keys("chunk", c, kChunkKeys);
                append_string(get(c, "content"), text, cap);
                if (is_true(c, "stop")) {
                    stop_chunk = 1;
                    expect_final("final chunk", c);
                }
                c = ws(skip_value(c));
                if (*c == ',') c = ws(c + 1);
            }
        }
        finished = is_true(p, "finished");
        free(p);
        if (cancel_after_first && polls == 1 && !finished) {
            char * c = (char *)async_completion_cancel("{}");
            CHECK(c && is_true(c, "success"), "cancel: %s", c ? c : "(null)");
            free(c);
            cancelled = 1;
        }
        if (!finished) sleep_ms(2);
    }
    CHECK(finished, "the stream finished (%d polls)", polls);
    if (!cancel_after_first) CHECK(stop_chunk, "the last update is the final response (stop: true)");
    if (cancelled_ok) *cancelled_ok = cancelled && finished;
}

int main(void) {
    const char * dir = getenv("SPECRPC_MODELS_DIR") ? getenv("SPECRPC_MODELS_DIR") : SPECRPC_MODELS_DIR;
    snprintf(g_model, sizeof g_model, "%s/stories260K-F32.gguf", dir);
    char cmd[4096];
    char * r;

    /* not initialised yet: init_success 0 */
    r = (char *)poll_system_status();
    expect_keys("status before init", r, kStatusKeys);
    CHECK(get_int(r, "init_success") == 0, "init_success 0 before init: %s", r);
    free(r);

    /* a failing init: 1, and init_success -1 */
    CHECK(init("server -m /nonexistent/model.gguf") == 1, "init of a missing file returns 1");
    r = (char *)poll_system_status();
    CHECK(get_int(r, "init_success") == -1, "init_success -1 after a failed init: %s", r);
    free(r);

    /* init from a command line as the existing library parses it (argv[0] first), with flags of
       its llama.cpp that have no use here: 0 */
    snprintf(cmd, sizeof cmd, "server -m %s -c 256 -t 1 -tb 1 --memory-f32 --embedding -n 400 --rope-freq-base 10000",
             g_model);
    CHECK(init(cmd) == 0, "init from a command line returns 0");
    r = (char *)poll_system_status();
    expect_keys("status", r, kStatusKeys);
    CHECK(get_int(r, "init_success") == 1, "init_success 1 after init: %s", r);
    free(r);

    tokenize_twice();

    /* get_completion: the final response with every key of the existing library */
    r = (char *)get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":16,\"temperature\":0}");
    expect_final("get_completion", r);
    CHECK(type_of(get(r, "prompt_stats")) == 'o', "get_completion prompt_stats");
    expect_keys("get_completion prompt_stats", get(r, "prompt_stats"), kPromptStatsKeys);
    CHECK(get_int(r, "tokens_predicted") == 16 && is_true(r, "stopped_limit"), "16 tokens, stopped_limit: %.300s", r);
    CHECK(get(r, "prompt") && !strncmp(get(r, "prompt"), "\"Once upon a time\"", 18), "prompt as sent: %.300s", r);
    char greedy[4096] = "";
    append_string(get(r, "content"), greedy, sizeof greedy);
    CHECK(strlen(greedy) > 10, "content: %s", greedy);
    free(r);

    /* n_probs: the existing library's completion_probabilities */
    r = (char *)get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":3,\"temperature\":0,\"n_probs\":2}");
    expect_final("n_probs", r);
    expect_probs("n_probs", r, 2);
    free(r);

    /* any n_predict is a cap, bounded by the context */
    r = (char *)get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":100000,\"temperature\":0}");
    CHECK(r && get(r, "content") && type_of(get(r, "tokens_predicted")) == 'i', "n_predict 100000: %.300s", r);
    CHECK(get_int(r, "tokens_predicted") > 0 && get_int(r, "tokens_predicted") < 256, "bounded by the context: %.300s", r);
    free(r);

    /* a stream through async init/poll: the chunks add up to the greedy text */
    char text[8192];
    stream("{\"prompt\":\"Once upon a time\",\"n_predict\":16,\"temperature\":0}", text, sizeof text, 0, NULL);
    CHECK(strcmp(text, greedy) == 0, "streamed '%s' vs get_completion '%s'", text, greedy);

    /* cancel: the poll still succeeds and reports the end */
    int cancelled_ok = 0;
    stream("{\"prompt\":\"Once upon a time\",\"n_predict\":200,\"ignore_eos\":true}", text, sizeof text, 1, &cancelled_ok);
    CHECK(cancelled_ok, "cancelled stream ends with finished: true");
    /* after the end a polling loop still sees finished: true, and a cancel succeeds (nothing to cancel) */
    r = (char *)async_completion_poll("{}");
    CHECK(r && is_true(r, "finished") && type_of(get(r, "completion_updates")) == 'a', "poll after the end: %s", r);
    free(r);
    r = (char *)async_completion_cancel("{}");
    CHECK(r && is_true(r, "success"), "cancel after the end: %s", r);
    free(r);

    /* deinit, then init from JSON with the existing library's server_params keys */
    deinit();
    snprintf(cmd, sizeof cmd,
             "{\"model\": \"%s\", \"n_ctx\": 128, \"n_threads\": 1, \"hostname\": \"127.0.0.1\", \"port\": 8080}", g_model);
    CHECK(init(cmd) == 0, "init from JSON returns 0");
    r = (char *)poll_system_status();
    CHECK(get_int(r, "init_success") == 1, "init_success 1 after JSON init: %s", r);
    free(r);
    tokenize_twice();

    /* init_async, polled until init_success == 1 */
    snprintf(cmd, sizeof cmd, "server -m %s -c 256 -t 1", g_model);
    init_async(cmd);
    int loaded = 0;
    double t0 = now_s();
    while (now_s() - t0 < 60) {
        r = (char *)poll_system_status();
        long s = get_int(r, "init_success");
        free(r);
        if (s == 1) { loaded = 1; break; }
        CHECK(s == 0, "init_success while loading is 0, not %ld", s);
        if (s != 0) break;
        sleep_ms(5);
    }
    CHECK(loaded, "init_async: init_success reached 1");
    r = (char *)get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":16,\"temperature\":0}");
    text[0] = '\0';
    append_string(get(r, "content"), text, sizeof text);
    CHECK(strcmp(text, greedy) == 0, "after init_async: '%s' vs '%s'", text, greedy);
    free(r);
    deinit();

    fprintf(stderr, "legacy_c_test: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

/* The C ABIs from plain C, through the public headers only, linked to the shared library:
 * the whole legacy flow (init, status, tokenize, get_completion, async init/poll/cancel, deinit,
 * init again with JSON), bad input that must come back as error JSON (and leave the library
 * usable), specrpc_rpc / specrpc_rpc_stream / specrpc_free, and concurrent callers.
 * Run under ASan in CI: every string is either freed or owned by the library. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "specrpc/rpcserver.h"
#include "specrpc/specrpc.h"

static int g_failures = 0;
static int g_checks   = 0;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        g_checks++;                                                            \
        if (!(cond)) {                                                         \
            g_failures++;                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
        }                                                                      \
    } while (0)

static const char * S(const char * s) { return s ? s : "(null)"; }
static int has(const char * s, const char * needle) { return s && strstr(s, needle) != NULL; }

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Appends every "content":"..." string value found in `s` after `from` (raw, escapes kept). */
static void append_contents(const char * s, char * out, size_t cap, int only_first) {
    const char * p = s;
    while ((p = strstr(p, "\"content\":\"")) != NULL) {
        p += 11;
        size_t n = strlen(out);
        while (*p && *p != '"') {
            if (*p == '\\' && p[1]) {
                if (n + 2 < cap) { out[n++] = p[0]; out[n++] = p[1]; }
                p += 2;
                continue;
            }
            if (n + 1 < cap) out[n++] = *p;
            p++;
        }
        out[n] = '\0';
        if (only_first) return;
    }
}

static char g_model[1024], g_draft[1024], g_baby[1024];

/* An error JSON that names `what` (a param or a word of the message), then a valid call works. */
static void expect_error(const char * label, const char * r, const char * code, const char * what) {
    CHECK(has(r, "\"success\":false"), "%s: %s", label, S(r));
    CHECK(has(r, code), "%s: want code %s: %s", label, code, S(r));
    if (what) CHECK(has(r, what), "%s: want '%s' in %s", label, what, S(r));
    const char * ok = tokenize("{\"text\":\"Lily\"}");
    CHECK(has(ok, "\"success\":true"), "%s: next call failed: %s", label, ok);
}

/* ---- concurrency ------------------------------------------------------------------------- */

static void * worker(void * arg) {
    int * fails = (int *)arg;
    for (int i = 0; i < 4; i++) {
        const char * a = get_completion("{\"prompt\":\"Tom and Sue\",\"n_predict\":8,\"temperature\":0}");
        if (!has(a, "\"success\":true") || !has(a, "\"tokens_predicted\":8")) (*fails)++;
        const char * b = tokenize("{\"text\":\"Once upon a time\"}");
        if (!has(b, "\"success\":true")) (*fails)++;
        /* `a` is released by this thread's next call; `b` stays valid until then */
        if (!has(b, "\"length\":")) (*fails)++;
        char * c = specrpc_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"health\"}");
        if (!has(c, "\"ok\"")) (*fails)++;
        specrpc_free(c);
    }
    return NULL;
}

/* VmRSS of this process in KiB (0 if unknown). */
static long rss_kib(void) {
    FILE * f = fopen("/proc/self/status", "r");
    char   line[256];
    long   kib = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) kib = strtol(line + 6, NULL, 10);
    fclose(f);
    return kib;
}

/* A tokenize call of ~1 MB of text (the legacy string is the thread's until its next call). */
static void * big_tokenize(void * arg) {
    int *  fails = (int *)arg;
    size_t n     = 1 << 20;
    char * req   = malloc(n + 64);
    if (!req) { (*fails)++; return NULL; }
    strcpy(req, "{\"text\":\"");
    size_t k = strlen(req);
    while (k + 20 < n) { memcpy(req + k, "Once upon a time. ", 18); k += 18; }
    strcpy(req + k, "\"}");
    for (int round = 0; round < 2; round++) {
        const char * r = tokenize(req);
        if (!has(r, "\"success\":true")) (*fails)++;
        specrpc_free((void *)r);
    }
    free(req);
    return NULL;
}

static int g_notes = 0;
static char g_stream_text[8192];
static void on_note(const char * json, void * user) {
    (void)user;
    if (has(json, "\"method\":\"completion.chunk\"")) {
        g_notes++;
        append_contents(json, g_stream_text, sizeof g_stream_text, 1);
    }
}

int main(void) {
    const char * dir = getenv("SPECRPC_MODELS_DIR") ? getenv("SPECRPC_MODELS_DIR") : SPECRPC_MODELS_DIR;
    snprintf(g_model, sizeof g_model, "%s/stories260K-F32.gguf", dir);
    snprintf(g_draft, sizeof g_draft, "%s/stories260K-Q8_0.gguf", dir);
    snprintf(g_baby, sizeof g_baby, "%s/BabyLlama-tok105-F32.gguf", dir);
    char cmd[4096], req[16384];
    const char * r;

    CHECK(specrpc_version() && strlen(specrpc_version()) >= 5, "version");

    /* 1. before init: errors, never a crash */
    r = get_completion("{\"prompt\":\"Once\"}");
    CHECK(has(r, "\"success\":false") && has(r, "-32001"), "completion before init: %s", S(r));
    r = tokenize("{\"text\":\"Once\"}");
    CHECK(has(r, "\"success\":false") && has(r, "-32001"), "tokenize before init: %s", S(r));
    r = poll_system_status();
    CHECK(has(r, "\"init_success\":false"), "status before init: %s", S(r));
    r = async_completion_init("{\"prompt\":\"Once\"}");
    CHECK(has(r, "\"success\":false"), "async before init: %s", S(r));
    r = async_completion_poll(NULL);
    CHECK(has(r, "\"success\":false"), "poll without a request: %s", S(r));
    r = get_completion(NULL);
    CHECK(has(r, "\"success\":false"), "NULL request: %s", S(r));

    /* 2. failing inits: 0, and the reason in poll_system_status */
    CHECK(init("-m /nonexistent/model.gguf") == 0, "missing file");
    r = poll_system_status();
    CHECK(has(r, "/nonexistent/model.gguf") && has(r, "\"error\""), "missing file reason: %s", S(r));
    CHECK(init(NULL) == 0, "NULL cmd");
    CHECK(init("{\"model\": ") == 0, "malformed JSON cmd");
    CHECK(has(poll_system_status(), "malformed"), "malformed reason: %s", poll_system_status());
    snprintf(cmd, sizeof cmd, "-m %s --frobnicate 3", g_model);
    CHECK(init(cmd) == 0, "unknown flag");
    CHECK(has(poll_system_status(), "--frobnicate"), "unknown flag reason: %s", poll_system_status());
    snprintf(cmd, sizeof cmd, "-m %s -c lots", g_model);
    CHECK(init(cmd) == 0, "bad value");
    {   /* a truncated GGUF: the first 1000 bytes of a real model */
        char trunc[256];
        snprintf(trunc, sizeof trunc, "/tmp/specrpc_capi_trunc_%d.gguf", (int)getpid());
        FILE * in = fopen(g_model, "rb");
        FILE * out = fopen(trunc, "wb");
        CHECK(in && out, "temp files");
        if (in && out) {
            char buf[1000];
            size_t n = fread(buf, 1, sizeof buf, in);
            fwrite(buf, 1, n, out);
        }
        if (in) fclose(in);
        if (out) fclose(out);
        snprintf(cmd, sizeof cmd, "-m %s", trunc);
        CHECK(init(cmd) == 0, "truncated GGUF");
        r = poll_system_status();
        CHECK(has(r, "\"init_success\":false") && has(r, trunc), "truncated reason: %s", S(r));
        remove(trunc);
    }
    snprintf(cmd, sizeof cmd, "-m %s -md %s", g_model, g_baby);
    CHECK(init(cmd) == 0, "mismatched draft vocab");
    CHECK(has(poll_system_status(), "vocab"), "vocab reason: %s", poll_system_status());
    r = get_completion("{\"prompt\":\"Once\"}");
    CHECK(has(r, "\"success\":false") && has(r, "-32001"), "completion after a failed init: %s", S(r));

    /* 3. a real init from a command line (target + draft, 2 slots) */
    snprintf(cmd, sizeof cmd, "-m '%s' -md '%s' -c 512 -np 2 -t 1 --spec-type draft --draft-max 4", g_model, g_draft);
    CHECK(init(cmd) == 1, "init: %s", poll_system_status());
    r = poll_system_status();
    CHECK(has(r, "\"init_success\":true") && has(r, "\"loading_progress\":1.0") && has(r, "stories260K-F32.gguf"),
          "status: %s", S(r));
    r = tokenize("{\"text\":\"Once upon a time\"}");
    CHECK(has(r, "\"success\":true") && has(r, "\"length\":4") && has(r, "\"tokens\":["), "tokenize: %s", S(r));
    /* adaptive off: on this tiny target the draft costs as much as the target, so the policy
       (rightly) never drafts; a fixed length makes the draft statistics visible */
    r = get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":24,\"temperature\":0,"
                       "\"speculative\":{\"adaptive\":false}}");
    CHECK(has(r, "\"success\":true") && has(r, "Lily") && has(r, "\"stop_type\":\"limit\""), "completion: %s", S(r));
    CHECK(has(r, "\"draft_n\":") && !has(r, "\"draft_n\":0,"), "draft stats with the draft model: %s", S(r));

    /* 4. bad requests: error JSON naming the problem, and the next call works */
    expect_error("malformed", get_completion("{\"prompt\": \"x\", "), "-32700", "malformed");
    expect_error("not an object", get_completion("[1, 2]"), "-32602", NULL);
    expect_error("wrong type", get_completion("{\"prompt\":\"x\",\"n_predict\":\"ten\"}"), "-32602", "\"param\":\"n_predict\"");
    expect_error("out of range", get_completion("{\"prompt\":\"x\",\"n_predict\":100000}"), "-32602", "\"param\":\"n_predict\"");
    expect_error("temperature type", get_completion("{\"prompt\":\"x\",\"temperature\":[1]}"), "-32602", "\"param\":\"temperature\"");
    expect_error("token id >= n_vocab", get_completion("{\"prompt\":[1, 600, 3]}"), "-32602", "\"param\":\"prompt\"");
    expect_error("invalid grammar", get_completion("{\"prompt\":\"x\",\"grammar\":\"root ::= [\"}"), "-32602", "\"param\":\"grammar\"");
    expect_error("tokenize wrong type", tokenize("{\"text\": 5}"), "-32602", "\"param\":\"text\"");
    expect_error("logit_bias id", get_completion("{\"prompt\":\"x\",\"logit_bias\":[[9999, 1]]}"), "-32602", "logit_bias");
    {   /* a prompt longer than the context (256) */
        strcpy(req, "{\"prompt\":\"");
        for (int i = 0; i < 60; i++) strcat(req, "Lily saw a big red ball. ");
        strcat(req, "\"}");
        expect_error("context exceeded", get_completion(req), "-32002", "\"n_prompt_tokens\":");
        CHECK(has(get_completion(req), "\"n_ctx\":256"), "n_ctx in the error");
    }

    /* 5. async: poll until finished; the chunks add up to the result */
    r = async_completion_init("{\"prompt\":\"Once upon a time\",\"n_predict\":40,\"temperature\":0}");
    CHECK(has(r, "\"success\":true") && has(r, "\"request_id\":"), "async init: %s", S(r));
    {
        char streamed[8192] = "", final_text[8192] = "";
        int finished = 0, polls = 0;
        double t0 = now_s();
        while (!finished && now_s() - t0 < 30) {
            r = async_completion_poll("{}");
            polls++;
            CHECK(has(r, "\"success\":true"), "poll: %s", S(r));
            if (!has(r, "\"success\":true")) break;
            const char * res = strstr(r, "\"result\":{");
            char updates[8192] = "";
            /* the updates come first (keys are sorted): copy them up to "finished" */
            const char * end = strstr(r, "\"finished\":");
            size_t n = end ? (size_t)(end - r) : strlen(r);
            if (n >= sizeof updates) n = sizeof updates - 1;
            memcpy(updates, r, n);
            updates[n] = '\0';
            append_contents(updates, streamed, sizeof streamed, 0);
            if (has(r, "\"finished\":true")) {
                finished = 1;
                CHECK(res != NULL, "final poll has the result: %s", S(r));
                if (res) append_contents(res, final_text, sizeof final_text, 1);
            } else {
                sleep_ms(2);
            }
        }
        CHECK(finished, "async finished in time (%d polls)", polls);
        CHECK(strlen(final_text) > 10 && strcmp(streamed, final_text) == 0, "chunks '%s' vs result '%s'", streamed,
              final_text);
        r = async_completion_poll("{}");
        CHECK(has(r, "\"success\":false") && has(r, "-32004"), "a finished request is forgotten: %s", S(r));
    }

    /* 6. async cancel: -32800 with the partial result, and the slot is free again */
    r = async_completion_init("{\"prompt\":\"Once upon a time\",\"n_predict\":240,\"ignore_eos\":true,\"temperature\":0}");
    CHECK(has(r, "\"success\":true"), "async init 2: %s", S(r));
    r = async_completion_cancel(NULL);
    CHECK(has(r, "\"success\":true"), "cancel: %s", S(r));
    {
        double t0 = now_s();
        int finished = 0;
        while (!finished && now_s() - t0 < 30) {
            r = async_completion_poll(NULL);
            if (has(r, "\"finished\":true")) finished = 1;
            else sleep_ms(2);
        }
        CHECK(finished && has(r, "\"success\":false") && has(r, "-32800") && has(r, "\"cancelled\":true"),
              "cancelled: %s", S(r));
        CHECK(!has(r, "\"tokens_predicted\":240"), "cancelled before the end: %.300s", S(r));
    }
    r = async_completion_poll("{\"request_id\": 999}");
    CHECK(has(r, "\"success\":false") && has(r, "request_id"), "unknown request id: %s", S(r));
    r = async_completion_poll("{\"request_id\": \"x\"}");
    CHECK(has(r, "\"success\":false") && has(r, "-32602"), "bad request id: %s", S(r));

    /* 7. the new ABI */
    {
        char * a = specrpc_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tokenize\",\"params\":{\"content\":\"Once\"}}");
        CHECK(has(a, "\"result\":{\"tokens\":[") && has(a, "\"id\":1"), "rpc tokenize: %s", a);
        specrpc_free(a);
        CHECK(specrpc_rpc("{\"jsonrpc\":\"2.0\",\"method\":\"health\"}") == NULL, "notification -> NULL");
        a = specrpc_rpc("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":");
        CHECK(has(a, "-32700"), "parse error: %s", a);
        specrpc_free(a);
        a = specrpc_rpc(NULL);
        CHECK(has(a, "-32600"), "NULL request: %s", a);
        specrpc_free(a);
        a = specrpc_rpc("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"health\"},{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"nope\"}]");
        CHECK(has(a, "\"status\":\"ok\"") && has(a, "-32601"), "batch: %s", a);
        specrpc_free(a);
        a = specrpc_rpc("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"detokenize\",\"params\":{\"tokens\":[1, 4000]}}");
        CHECK(has(a, "-32602") && has(a, "\"param\":\"tokens\""), "detokenize range: %s", a);
        specrpc_free(a);
        a = specrpc_rpc_stream("{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"completion\",\"params\":{\"prompt\":\"Once upon a time\","
                               "\"n_predict\":12,\"temperature\":0,\"stream\":true}}",
                               on_note, NULL);
        char final_text[4096] = "";
        append_contents(a, final_text, sizeof final_text, 1);
        CHECK(g_notes >= 2 && strcmp(g_stream_text, final_text) == 0, "stream: %d notes, '%s' vs '%s'", g_notes,
              g_stream_text, final_text);
        specrpc_free(a);
        /* legacy strings may be released early, from any thread, exactly once */
        specrpc_free((void *)poll_system_status());
        specrpc_free(NULL);
        r = poll_system_status();
        CHECK(has(r, "\"init_success\":true"), "after early free: %s", S(r));
    }

    /* 8. concurrent callers (more than the 2 slots) */
    {
        pthread_t th[3];
        int fails[3] = {0, 0, 0};
        for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, worker, &fails[i]);
        for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
        CHECK(fails[0] + fails[1] + fails[2] == 0, "concurrent failures: %d %d %d", fails[0], fails[1], fails[2]);
    }

    /* 8b. memory a large call used goes back to the OS (common/heap.h): glibc keeps a thread's
       largest block in its arena once its mmap threshold has risen; not under ASan (its own
       allocator) */
    {
        pthread_t th[4];
        int       fails[4] = {0, 0, 0, 0};
        big_tokenize(&fails[0]); /* the first one may size lasting buffers */
        long before = rss_kib();
        for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, big_tokenize, &fails[i]);
        for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
        long growth = (rss_kib() - before) / 1024;
        CHECK(fails[0] + fails[1] + fails[2] + fails[3] == 0, "large tokenize failures");
        fprintf(stderr, "capi_c_test: RSS %+ld MB over 8 tokenize calls of 1 MB from 4 threads\n", growth);
#if !defined(__SANITIZE_ADDRESS__)
        CHECK(growth < 16, "RSS grew by %ld MB over 8 tokenize calls of 1 MB", growth);
#endif
    }

    /* 9. deinit, then init again with JSON */
    deinit();
    r = get_completion("{\"prompt\":\"Once\"}");
    CHECK(has(r, "\"success\":false") && has(r, "-32001"), "after deinit: %s", S(r));
    snprintf(cmd, sizeof cmd, "{\"model\": \"%s\", \"ctx_size\": 128, \"threads\": 1, \"parallel\": 1}", g_model);
    CHECK(init(cmd) == 1, "init JSON: %s", poll_system_status());
    {
        char * a = specrpc_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"props\"}");
        CHECK(has(a, "\"n_ctx\":128") && has(a, "\"total_slots\":1"), "props after re-init: %.300s", a);
        specrpc_free(a);
    }
    r = get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":4,\"temperature\":0}");
    CHECK(has(r, "\"success\":true") && has(r, "\"tokens_predicted\":4"), "completion after re-init: %s", S(r));
    init_async(cmd);
    {
        double t0 = now_s();
        while (has(poll_system_status(), "\"state\":\"loading\"") && now_s() - t0 < 30) sleep_ms(5);
        CHECK(has(poll_system_status(), "\"init_success\":true"), "init_async: %s", poll_system_status());
    }
    deinit();
    deinit(); /* twice is fine */
    CHECK(has(poll_system_status(), "\"init_success\":false"), "after deinit");

    fprintf(stderr, "capi_c_test: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

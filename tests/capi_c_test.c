/* The C ABIs from plain C, through the public headers only, linked to the shared library:
 * the whole legacy flow (init, status, tokenize, get_completion, async init/poll/cancel, deinit,
 * init again with JSON), bad input that must come back as error JSON (and leave the library
 * usable), specrpc_rpc / specrpc_rpc_stream / specrpc_free, concurrent callers, and the races of
 * async jobs with init/deinit and with each other. Run under ASan in CI: every string returned
 * is the caller's and is freed (take() keeps the last kKeep alive, then frees them). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "c_check.h"
#include "specrpc/rpcserver.h"
#include "specrpc/specrpc.h"

static const char * S(const char * s) { return s ? s : "(null)"; }

/* Every string the library returns is the caller's (malloc'd): take() keeps the last kKeep of
 * them alive for the checks that read them, and frees the older ones. Main thread only. */
enum { kKeep = 64 };
static char * g_kept[kKeep];
static int    g_kept_next = 0;
static const char * take(const char * s) {
    free(g_kept[g_kept_next]);
    g_kept[g_kept_next] = (char *)s;
    g_kept_next = (g_kept_next + 1) % kKeep;
    return s;
}
static void free_kept(void) {
    for (int i = 0; i < kKeep; i++) { free(g_kept[i]); g_kept[i] = NULL; }
}
static int has(const char * s, const char * needle) { return s && strstr(s, needle) != NULL; }

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
    take(r);
    CHECK(has(r, "\"success\":false"), "%s: %s", label, S(r));
    CHECK(has(r, code), "%s: want code %s: %s", label, code, S(r));
    if (what) CHECK(has(r, what), "%s: want '%s' in %s", label, what, S(r));
    const char * ok = take(tokenize("{\"text\":\"Lily\"}"));
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
        if (!has(b, "\"length\":")) (*fails)++;
        free((void *)a);
        free((void *)b);
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

/* A tokenize call of ~1 MB of text. */
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

/* ---- async jobs against init/deinit, and against each other --------------------------------- */

static int g_race_stop = 0;

/* Starts jobs (polling and cancelling some) until told to stop; counts the ones started. */
static void * race_starter(void * arg) {
    int * started = (int *)arg;
    unsigned seed = (unsigned)(size_t)arg;
    while (!__atomic_load_n(&g_race_stop, __ATOMIC_ACQUIRE)) {
        char * r = (char *)async_completion_init("{\"prompt\":\"Once upon a time\",\"n_predict\":6,\"temperature\":0}");
        if (has(r, "\"success\":true")) (*started)++;
        free(r);
        r = (char *)async_completion_poll("{}");
        free(r);
        if (rand_r(&seed) % 3 == 0) free((char *)async_completion_cancel("{}"));
    }
    return NULL;
}

/* Two threads poll the same request id; each counts the polls that report the end. */
struct PollArg {
    char req[64];
    int  finished_reports;
    int  other_errors;
};
static void * poll_until_end(void * arg) {
    struct PollArg * a = (struct PollArg *)arg;
    for (int i = 0; i < 100000; i++) {
        char * r = (char *)async_completion_poll(a->req);
        int done = 0;
        if (has(r, "\"success\":false")) {
            if (!has(r, "-32004")) a->other_errors++; /* -32004: the other thread took the end */
            done = 1;
        } else if (has(r, "\"finished\":true")) {
            a->finished_reports++;
            done = 1;
        }
        free(r);
        if (done) break;
    }
    return NULL;
}

static int g_cb_chunks = 0, g_cb_init_rc = -1;
static char g_cb_cmd[4096];
/* A streaming callback that calls init (refused) and deinit from inside the call. */
static void on_note_deinit(const char * json, void * user) {
    (void)json;
    (void)user;
    if (g_cb_chunks++ == 0) {
        g_cb_init_rc = init(g_cb_cmd);
        deinit();
    }
}

/* The process's line `key` of /proc/self/status, in its unit (kB or a count); -1 if unknown. */
static long proc_status(const char * key) {
    FILE * f = fopen("/proc/self/status", "r");
    char   line[256];
    long   v = -1;
    size_t n = strlen(key);
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') v = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return v;
}

int main(void) {
    const char * dir = getenv("SPECRPC_MODELS_DIR") ? getenv("SPECRPC_MODELS_DIR") : SPECRPC_MODELS_DIR;
    snprintf(g_model, sizeof g_model, "%s/stories260K-F32.gguf", dir);
    snprintf(g_draft, sizeof g_draft, "%s/stories260K-Q8_0.gguf", dir);
    snprintf(g_baby, sizeof g_baby, "%s/BabyLlama-tok105-F32.gguf", dir);
    char cmd[4096], req[16384];
    const char * r;

    CHECK(specrpc_version() && strlen(specrpc_version()) >= 5, "version");
    /* the race sections alone (to check them against another build of the library) */
    if (getenv("CAPI_C_TEST_ONLY_RACES")) goto races;

    /* 1. before init: errors, never a crash */
    r = take(get_completion("{\"prompt\":\"Once\"}"));
    CHECK(has(r, "\"success\":false") && has(r, "-32001"), "completion before init: %s", S(r));
    {   /* specrpc.h names the codes */
        char code[32];
        snprintf(code, sizeof code, "\"code\":%d", SPECRPC_ERR_LOADING);
        CHECK(has(r, code), "SPECRPC_ERR_LOADING in %s", S(r));
    }
    r = take(tokenize("{\"text\":\"Once\"}"));
    CHECK(has(r, "\"success\":false") && has(r, "-32001"), "tokenize before init: %s", S(r));
    r = take(poll_system_status());
    CHECK(has(r, "\"init_success\":0"), "status before init: %s", S(r));
    r = take(async_completion_init("{\"prompt\":\"Once\"}"));
    CHECK(has(r, "\"success\":false"), "async before init: %s", S(r));
    r = take(async_completion_poll(NULL));
    CHECK(has(r, "\"success\":false"), "poll without a request: %s", S(r));
    r = take(get_completion(NULL));
    CHECK(has(r, "\"success\":false"), "NULL request: %s", S(r));

    /* 2. failing inits: 1 (as the existing library), and the reason in poll_system_status */
    CHECK(init("-m /nonexistent/model.gguf") == 1, "missing file");
    r = take(poll_system_status());
    CHECK(has(r, "/nonexistent/model.gguf") && has(r, "\"error\""), "missing file reason: %s", S(r));
    CHECK(init(NULL) == 1, "NULL cmd");
    CHECK(init("{\"model\": ") == 1, "malformed JSON cmd");
    CHECK(has(take(poll_system_status()), "malformed"), "malformed reason: %s", take(poll_system_status()));
    snprintf(cmd, sizeof cmd, "-m %s --frobnicate 3", g_model);
    CHECK(init(cmd) == 1, "unknown flag");
    CHECK(has(take(poll_system_status()), "--frobnicate"), "unknown flag reason: %s", take(poll_system_status()));
    snprintf(cmd, sizeof cmd, "-m %s -c lots", g_model);
    CHECK(init(cmd) == 1, "bad value");
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
        CHECK(init(cmd) == 1, "truncated GGUF");
        r = take(poll_system_status());
        CHECK(has(r, "\"init_success\":-1") && has(r, trunc), "truncated reason: %s", S(r));
        remove(trunc);
    }
    snprintf(cmd, sizeof cmd, "-m %s -md %s", g_model, g_baby);
    CHECK(init(cmd) == 1, "mismatched draft vocab");
    CHECK(has(take(poll_system_status()), "vocab"), "vocab reason: %s", take(poll_system_status()));
    r = take(get_completion("{\"prompt\":\"Once\"}"));
    CHECK(has(r, "\"success\":false") && has(r, "-32001"), "completion after a failed init: %s", S(r));

    /* 3. a real init from a command line (target + draft, 2 slots) */
    snprintf(cmd, sizeof cmd, "-m '%s' -md '%s' -c 512 -np 2 -t 1 --spec-type draft --draft-max 4", g_model, g_draft);
    CHECK(init(cmd) == 0, "init: %s", take(poll_system_status()));
    r = take(poll_system_status());
    CHECK(has(r, "\"init_success\":1") && has(r, "\"loading_progress\":1.0") && has(r, "stories260K-F32.gguf"),
          "status: %s", S(r));
    r = take(tokenize("{\"text\":\"Once upon a time\"}"));
    CHECK(has(r, "\"success\":true") && has(r, "\"length\":5") && has(r, "\"tokens\":[\"\",\" Once\"") && has(r, "\"ids\":[1,403,"), "tokenize: %s", S(r));
    /* adaptive off: on this tiny target the draft costs as much as the target, so the policy
       (rightly) never drafts; a fixed length makes the draft statistics visible */
    r = take(get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":24,\"temperature\":0,"
                       "\"speculative\":{\"adaptive\":false}}"));
    CHECK(has(r, "\"success\":true") && has(r, "Lily") && has(r, "\"stop_type\":\"limit\""), "completion: %s", S(r));
    CHECK(has(r, "\"draft_n\":") && !has(r, "\"draft_n\":0,"), "draft stats with the draft model: %s", S(r));

    /* 4. bad requests: error JSON naming the problem, and the next call works */
    expect_error("malformed", get_completion("{\"prompt\": \"x\", "), "-32700", "malformed");
    expect_error("not an object", get_completion("[1, 2]"), "-32602", NULL);
    expect_error("wrong type", get_completion("{\"prompt\":\"x\",\"n_predict\":\"ten\"}"), "-32602", "\"param\":\"n_predict\"");
    expect_error("out of range", get_completion("{\"prompt\":\"x\",\"n_predict\":-2}"), "-32602", "\"param\":\"n_predict\"");
    expect_error("temperature type", get_completion("{\"prompt\":\"x\",\"temperature\":[1]}"), "-32602", "\"param\":\"temperature\"");
    expect_error("token id >= n_vocab", get_completion("{\"prompt\":[1, 600, 3]}"), "-32602", "\"param\":\"prompt\"");
    expect_error("invalid grammar", get_completion("{\"prompt\":\"x\",\"grammar\":\"root ::= [\"}"), "-32602", "\"param\":\"grammar\"");
    expect_error("tokenize wrong type", tokenize("{\"text\": 5}"), "-32602", "\"param\":\"text\"");
    expect_error("logit_bias id", get_completion("{\"prompt\":\"x\",\"logit_bias\":[[9999, 1]]}"), "-32602", "logit_bias");
    {   /* a prompt longer than the context (256) */
        strcpy(req, "{\"prompt\":\"");
        for (int i = 0; i < 60; i++) strcat(req, "Lily saw a big red ball. ");
        strcat(req, "\",\"n_predict\":4}");
        /* truncated (n_keep + the tail) as the existing library did */
        r = take(get_completion(req));
        CHECK(has(r, "\"success\":true") && has(r, "\"truncated\":true"), "long prompt truncated: %.300s", S(r));
        /* unless truncate: false */
        req[strlen(req) - 1] = '\0';
        strcat(req, ",\"truncate\":false}");
        expect_error("context exceeded", get_completion(req), "-32002", "\"n_prompt_tokens\":");
        CHECK(has(take(get_completion(req)), "\"n_ctx\":256"), "n_ctx in the error");
    }

    /* 5. async: poll until finished; the chunks add up to the result */
    r = take(async_completion_init("{\"prompt\":\"Once upon a time\",\"n_predict\":40,\"temperature\":0}"));
    CHECK(has(r, "\"success\":true") && has(r, "\"request_id\":"), "async init: %s", S(r));
    {
        char streamed[8192] = "", final_text[8192] = "";
        int finished = 0, polls = 0;
        double t0 = now_s();
        while (!finished && now_s() - t0 < 30) {
            r = take(async_completion_poll("{}"));
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
        r = take(async_completion_poll("{}"));
        CHECK(has(r, "\"success\":false") && has(r, "-32004"), "a finished request is forgotten: %s", S(r));
    }

    /* 6. async cancel: the end is reported as the existing library did (success, finished), with
       "cancelled" and the partial result, and the slot is free again */
    r = take(async_completion_init("{\"prompt\":\"Once upon a time\",\"n_predict\":240,\"ignore_eos\":true,\"temperature\":0}"));
    CHECK(has(r, "\"success\":true"), "async init 2: %s", S(r));
    r = take(async_completion_cancel(NULL));
    CHECK(has(r, "\"success\":true"), "cancel: %s", S(r));
    {
        double t0 = now_s();
        int finished = 0;
        while (!finished && now_s() - t0 < 30) {
            r = take(async_completion_poll(NULL));
            if (has(r, "\"finished\":true")) finished = 1;
            else sleep_ms(2);
        }
        CHECK(finished && has(r, "\"success\":true") && has(r, "\"cancelled\":true") && has(r, "\"result\":{"),
              "cancelled: %s", S(r));
        CHECK(!has(r, "\"tokens_predicted\":240"), "cancelled before the end: %.300s", S(r));
    }
    r = take(async_completion_poll("{\"request_id\": 999}"));
    CHECK(has(r, "\"success\":false") && has(r, "request_id"), "unknown request id: %s", S(r));
    r = take(async_completion_poll("{\"request_id\": \"x\"}"));
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
        r = take(poll_system_status());
        CHECK(has(r, "\"init_success\":1"), "after early free: %s", S(r));
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
    r = take(get_completion("{\"prompt\":\"Once\"}"));
    CHECK(has(r, "\"success\":false") && has(r, "-32001"), "after deinit: %s", S(r));
    snprintf(cmd, sizeof cmd, "{\"model\": \"%s\", \"ctx_size\": 128, \"threads\": 1, \"parallel\": 1}", g_model);
    CHECK(init(cmd) == 0, "init JSON: %s", take(poll_system_status()));
    {
        char * a = specrpc_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"props\"}");
        CHECK(has(a, "\"n_ctx\":128") && has(a, "\"total_slots\":1"), "props after re-init: %.300s", a);
        specrpc_free(a);
    }
    r = take(get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":4,\"temperature\":0}"));
    CHECK(has(r, "\"success\":true") && has(r, "\"tokens_predicted\":4"), "completion after re-init: %s", S(r));
    init_async(cmd);
    {
        double t0 = now_s();
        while (has(take(poll_system_status()), "\"state\":\"loading\"") && now_s() - t0 < 30) sleep_ms(5);
        CHECK(has(take(poll_system_status()), "\"init_success\":1"), "init_async: %s", take(poll_system_status()));
    }
    deinit();
    deinit(); /* twice is fine */
    CHECK(has(take(poll_system_status()), "\"init_success\":0"), "after deinit");

races:
    /* 10. a context too small to be useful is refused, naming ctx_size */
    snprintf(cmd, sizeof cmd, "-m %s -c 1", g_model);
    CHECK(init(cmd) == 1, "-c 1 refused");
    r = take(poll_system_status());
    CHECK(has(r, "\"init_success\":-1") && has(r, "ctx_size"), "-c 1 reason: %s", S(r));

    /* 11. jobs started from 4 threads while the main thread re-initialises (init, init_async,
       deinit) for a bounded time: no abort (47abea0: "terminate called without an active
       exception", a joinable std::thread destroyed), and the library works afterwards */
    snprintf(cmd, sizeof cmd, "-m %s -c 256 -np 2 -t 1", g_model);
    CHECK(init(cmd) == 0, "init for the race");
    {
        pthread_t th[4];
        int started[4] = {0, 0, 0, 0}, reinits = 0;
        __atomic_store_n(&g_race_stop, 0, __ATOMIC_RELEASE);
        for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, race_starter, &started[i]);
        double t0 = now_s();
        while (now_s() - t0 < 3) {
            switch (reinits++ % 3) {
                case 0: init(cmd); break;
                case 1: init_async(cmd); break;
                case 2: deinit(); init(cmd); break;
            }
            sleep_ms(20);
        }
        __atomic_store_n(&g_race_stop, 1, __ATOMIC_RELEASE);
        for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
        fprintf(stderr, "capi_c_test: race: %d jobs started over %d re-inits\n",
                started[0] + started[1] + started[2] + started[3], reinits);
        CHECK(started[0] + started[1] + started[2] + started[3] > 0, "some jobs started during the race");
        /* the jobs still queued (nobody polls them) are cancelled by the next init, once the
           last init_async has finished loading (init refuses to run beside a load) */
        double t1 = now_s();
        while (has(take(poll_system_status()), "\"state\":\"loading\"") && now_s() - t1 < 60) sleep_ms(5);
        CHECK(init(cmd) == 0, "init after the race: %s", take(poll_system_status()));
        r = take(get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":4,\"temperature\":0}"));
        CHECK(has(r, "\"success\":true") && has(r, "\"tokens_predicted\":4"), "completion after the race: %s", S(r));
    }

    /* 12. two threads polling the same request id: exactly one of them is told it finished
       (47abea0: both were, 13-32 times per 1,000-3,000 jobs, then both joined one thread) */
    {
        int jobs = 0, reports = 0, errors = 0, extra = 0;
        double t0 = now_s();
        for (int i = 0; i < 1000 && now_s() - t0 < 60; i++) {
            r = take(async_completion_init("{\"prompt\":\"Once upon a time\",\"n_predict\":1,\"temperature\":0}"));
            const char * idp = strstr(r ? r : "", "\"request_id\":");
            if (!idp) { errors++; continue; }
            struct PollArg a[2];
            memset(a, 0, sizeof a);
            snprintf(a[0].req, sizeof a[0].req, "{\"request_id\":%ld}", strtol(idp + 13, NULL, 10));
            memcpy(a[1].req, a[0].req, sizeof a[0].req);
            pthread_t th[2];
            for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, poll_until_end, &a[k]);
            for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
            jobs++;
            const int n = a[0].finished_reports + a[1].finished_reports;
            reports += n;
            if (n > 1) extra++;
            errors += a[0].other_errors + a[1].other_errors;
        }
        fprintf(stderr, "capi_c_test: %d jobs polled by 2 threads: %d end reports, %d jobs reported twice\n", jobs,
                reports, extra);
        CHECK(jobs >= 100 && reports == jobs && errors == 0, "%d jobs, %d end reports, %d errors", jobs, reports, errors);
    }

    /* 13. jobs nobody polls: their threads end with them and give back their stacks (47abea0 kept
       each one joinable until a poll: 8 MiB of stack per job) */
    {
        const long threads0 = proc_status("Threads"), vm0 = proc_status("VmSize");
        for (int i = 0; i < 32; i++)
            free((char *)async_completion_init("{\"prompt\":\"Once upon a time\",\"n_predict\":2,\"temperature\":0}"));
        double t0 = now_s();
        while (proc_status("Threads") > threads0 && now_s() - t0 < 60) sleep_ms(10);
        const long vm_growth_mb = (proc_status("VmSize") - vm0) / 1024;
        fprintf(stderr, "capi_c_test: 32 unpolled jobs: threads %ld -> %ld, VmSize %+ld MB\n", threads0,
                proc_status("Threads"), vm_growth_mb);
        CHECK(proc_status("Threads") <= threads0, "the job threads ended");
        CHECK(vm_growth_mb < 128, "32 finished, unpolled jobs hold %ld MB of address space", vm_growth_mb);
        /* their results are kept until polled: the most recent one is there */
        r = take(async_completion_poll("{}"));
        CHECK(has(r, "\"finished\":true") && has(r, "\"result\":{"), "an unpolled job's result: %.200s", S(r));
    }

    /* 14. deinit() from inside a streaming callback: everything is cancelled at once and the
       engine is freed when the call returns (47abea0 waited 30 s for the call running the
       callback); init() from there is refused */
    {
        snprintf(g_cb_cmd, sizeof g_cb_cmd, "%s", cmd);
        double t0 = now_s();
        char * a = specrpc_rpc_stream("{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"completion\",\"params\":{\"prompt\":"
                                      "\"Once upon a time\",\"n_predict\":120,\"ignore_eos\":true,\"stream\":true}}",
                                      on_note_deinit, NULL);
        const double dt = now_s() - t0;
        fprintf(stderr, "capi_c_test: deinit from a callback: the call returned after %.2f s\n", dt);
        CHECK(g_cb_chunks >= 1 && g_cb_init_rc == 1, "init in the callback refused (%d chunks, rc %d)", g_cb_chunks,
              g_cb_init_rc);
        CHECK(has(a, "-32800"), "the call was cancelled: %.200s", S(a));
        /* not a timing target: the bug was a fixed 30 s wait */
        CHECK(dt < 15, "the call returned after %.1f s", dt);
        specrpc_free(a);
        CHECK(has(take(poll_system_status()), "\"init_success\":0"), "freed after the call");
        CHECK(init(cmd) == 0, "init again after a deinit from a callback");
        r = take(get_completion("{\"prompt\":\"Once upon a time\",\"n_predict\":4,\"temperature\":0}"));
        CHECK(has(r, "\"success\":true") && has(r, "\"tokens_predicted\":4"), "completion after that: %s", S(r));
    }
    deinit();
    free_kept();

    fprintf(stderr, "capi_c_test: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

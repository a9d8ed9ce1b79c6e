/* A fuzzer of the C ABIs (rpcserver.h and specrpc.h) from plain C: threads call init / init_async
 * / deinit / poll_system_status / tokenize / get_completion / async_completion_init / poll /
 * cancel / specrpc_rpc / specrpc_rpc_stream / free at once, with valid and invalid arguments
 * (random and mutated JSON, NULL, bad command lines), for a bounded time (SPECRPC_FUZZ_SECONDS,
 * default 20). Invariants: no crash or abort (ASan/UBSan in CI), no hang (a watchdog), every
 * answer is JSON, a job's end is reported once, and afterwards the library still initialises and
 * completes. Leaks are LSan's to find: every string is freed, and deinit ends every job. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "specrpc/rpcserver.h"
#include "specrpc/specrpc.h"

enum { kThreads = 6, kIds = 4096 };

static char         g_target[512], g_draft[512];
static double       g_end;
static int          g_failures;
static long         g_calls;
static int          g_finished[kIds]; /* "finished": true reports per request_id (ids < kIds) */
static int          g_ids[64];        /* recent request ids, shared between threads */
static volatile int g_done;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fail(const char * what, const char * detail) {
    __atomic_add_fetch(&g_failures, 1, __ATOMIC_RELAXED);
    fprintf(stderr, "FAIL %s: %.300s\n", what, detail ? detail : "(null)");
}

/* An answer must be a JSON object or array (a notification, through specrpc_rpc, may be NULL). */
static void check_json(const char * fn, const char * s, int may_be_null) {
    __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
    if (!s) {
        if (!may_be_null) fail(fn, "NULL answer");
        return;
    }
    size_t n = strlen(s);
    if (n < 2 || !((s[0] == '{' && s[n - 1] == '}') || (s[0] == '[' && s[n - 1] == ']'))) fail(fn, s);
}

static int rnd(unsigned * seed, int n) { return (int)(rand_r(seed) % (unsigned)n); }

/* A random request body: valid objects of the shapes each function takes, junk, and mutations. */
static void make_req(unsigned * seed, char * out, size_t cap) {
    static const char * valid[] = {
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"temperature\": 0}",
        "{\"prompt\": \"x\", \"n_predict\": 2, \"stream\": true}",
        "{\"prompt\": \"x\", \"n_predict\": 3, \"temperature\": 0.8, \"seed\": 7, \"speculative\": {\"n_max\": 4}}",
        "{\"prompt\": \"Une fois \\u00e9t\\u00e9\", \"n_predict\": 2, \"stop\": [\"e\"]}",
        "{\"prompt\": \"x\", \"n_predict\": 2, \"grammar\": \"root ::= [a-z]+\"}",
        "{\"prompt\": \"x\", \"n_predict\": 2, \"grammar\": \"root ::= \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"? \\\"a\\\"?\"}",
        "{\"content\": \"Once upon a time\", \"with_pieces\": true}",
        "{\"tokens\": [1, 403, 407]}",
        "{\"prompt\": [1, 403, 99999], \"n_predict\": 2}",
        "{\"prompt\": \"x\", \"n_predict\": -5}",
        "{\"prompt\": \"x\", \"n_predict\": 1, \"logit_bias\": [[-1, 1.0]]}",
        "{}",
    };
    static const char * junk[] = {"", "{", "[]", "null", "\"x\"", "{\"prompt\": 5}", "\xff\xfe{",
                                  "{\"request_id\": -1}", "{\"request_id\": \"a\"}", "{\"request_id\": 1e300}",
                                  "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "{\"prompt\": \"x\", \"n_predict\": 1e309}"};
    const int k = rnd(seed, 10);
    if (k < 6) {
        snprintf(out, cap, "%s", valid[rnd(seed, (int)(sizeof valid / sizeof *valid))]);
    } else if (k < 8) {
        snprintf(out, cap, "%s", junk[rnd(seed, (int)(sizeof junk / sizeof *junk))]);
    } else {  /* a valid one, mutated: bytes flipped or cut */
        snprintf(out, cap, "%s", valid[rnd(seed, (int)(sizeof valid / sizeof *valid))]);
        size_t n = strlen(out);
        if (n == 0) return;
        for (int i = rnd(seed, 4); i >= 0; i--) out[rnd(seed, (int)n)] = (char)(1 + rnd(seed, 255));
        if (rnd(seed, 2)) out[rnd(seed, (int)n)] = 0;
    }
}

static void make_cmd(unsigned * seed, char * out, size_t cap) {
    switch (rnd(seed, 9)) {
        case 0: snprintf(out, cap, "-m %s -c 256 -np 2 -t 1", g_target); break;
        case 1: snprintf(out, cap, "-m %s -md %s -c 256 -t 1", g_target, g_draft); break;
        case 2: snprintf(out, cap, "{\"model\": \"%s\", \"ctx_size\": 128, \"threads\": 1}", g_target); break;
        case 3: snprintf(out, cap, "-m /no/such/model.gguf"); break;
        case 4: snprintf(out, cap, "-m %s -c 1", g_target); break;
        case 5: snprintf(out, cap, "{\"model\": 5}"); break;
        case 6: snprintf(out, cap, "-m %s -b 3", g_target); break;
        case 7: snprintf(out, cap, "%s", rnd(seed, 2) ? "" : "{"); break;
        default: snprintf(out, cap, "-m %s -c 128 -np 3 -t 1 --tree-max 4", g_target); break;
    }
}

/* request_id of an answer, or -1 */
static int request_id(const char * s) {
    const char * p = s ? strstr(s, "\"request_id\":") : NULL;
    return p ? atoi(p + 13) : -1;
}

static void on_note(const char * json, void * user) {
    (void)user;
    if (!json || json[0] != '{') fail("notification", json);
}

static void * worker(void * arg) {
    unsigned seed = (unsigned)(size_t)arg * 7919u + (unsigned)time(NULL);
    char     req[2048], cmd[1200];
    while (now_s() < g_end) {
        const int op = rnd(&seed, 100);
        const char * r = NULL;
        if (op < 2) {  /* init: slow (a model load), so rare */
            make_cmd(&seed, cmd, sizeof cmd);
            int rc = init(cmd);
            if (rc != 0 && rc != 1) fail("init rc", cmd);
            __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
        } else if (op < 5) {
            make_cmd(&seed, cmd, sizeof cmd);
            specrpc_init_async(rnd(&seed, 10) ? cmd : NULL);
            __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
        } else if (op < 7) {
            deinit();
            __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
        } else if (op < 15) {
            r = poll_system_status();
            check_json("poll_system_status", r, 0);
            /* only valid model files and a missing one are loaded here: an aborted load must not
               read as a bad file (14305de: "truncated or unsupported GGUF?") */
            if (r && strstr(r, "truncated or unsupported")) fail("an aborted load reported as a bad file", r);
        } else if (op < 25) {
            make_req(&seed, req, sizeof req);
            r = tokenize(rnd(&seed, 20) ? req : NULL);
            check_json("tokenize", r, 0);
        } else if (op < 35) {
            make_req(&seed, req, sizeof req);
            r = get_completion(rnd(&seed, 20) ? req : NULL);
            check_json("get_completion", r, 0);
        } else if (op < 50) {
            make_req(&seed, req, sizeof req);
            r = async_completion_init(rnd(&seed, 20) ? req : NULL);
            check_json("async_completion_init", r, 0);
            int id = strstr(r ? r : "", "\"success\":true") ? request_id(r) : -1;
            if (id >= 0) __atomic_store_n(&g_ids[rnd(&seed, 64)], id, __ATOMIC_RELAXED);
        } else if (op < 75) {
            const int id = __atomic_load_n(&g_ids[rnd(&seed, 64)], __ATOMIC_RELAXED);
            if (rnd(&seed, 8)) snprintf(req, sizeof req, "{\"request_id\": %d}", id);
            else make_req(&seed, req, sizeof req);
            r = async_completion_poll(req);
            check_json("async_completion_poll", r, 0);
            if (r && strstr(r, "\"success\":true") && strstr(r, "\"finished\":true")) {
                int got = request_id(r);
                if (got >= 0 && got < kIds && __atomic_add_fetch(&g_finished[got], 1, __ATOMIC_RELAXED) > 1)
                    fail("a job's end reported twice", r);
            }
        } else if (op < 82) {
            const int id = __atomic_load_n(&g_ids[rnd(&seed, 64)], __ATOMIC_RELAXED);
            snprintf(req, sizeof req, "{\"request_id\": %d}", id);
            r = async_completion_cancel(rnd(&seed, 6) ? req : "{}");
            check_json("async_completion_cancel", r, 0);
        } else {
            static const char * methods[] = {"completion", "tokenize", "detokenize", "health", "props",
                                             "init", "deinit", "metrics", "slots", "$/cancelRequest", "nope"};
            const char * m = methods[rnd(&seed, (int)(sizeof methods / sizeof *methods))];
            char body[1400];
            if (strcmp(m, "init") == 0) {
                make_cmd(&seed, cmd, sizeof cmd);
                if (cmd[0] == '{') snprintf(body, sizeof body, "%s", cmd);
                else snprintf(body, sizeof body, "{\"model\": \"%s\", \"ctx_size\": %d, \"threads\": 1}", g_target,
                              rnd(&seed, 2) ? 128 : 1);
            } else {
                make_req(&seed, body, sizeof body);
            }
            snprintf(req, sizeof req, rnd(&seed, 8) ? "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"%s\",\"params\":%s}"
                                                    : "[{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"%s\",\"params\":%s}]",
                     rnd(&seed, 100), m, body[0] ? body : "{}");
            const int k = rnd(&seed, 10);
            r = k < 6 ? specrpc_rpc(req) : k < 9 ? specrpc_rpc_stream(req, on_note, NULL) : specrpc_rpc(NULL);
            check_json("specrpc_rpc", r, 1);
        }
        specrpc_free((void *)r);
    }
    return NULL;
}

static void * watchdog(void * arg) {
    const double limit = *(const double *)arg;
    while (!__atomic_load_n(&g_done, __ATOMIC_ACQUIRE)) {
        if (now_s() > limit) {
            fprintf(stderr, "FAIL: hang (the fuzz did not end in time)\n");
            fflush(stderr);
            _exit(2);
        }
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int main(void) {
    const char * dir  = getenv("SPECRPC_MODELS_DIR") ? getenv("SPECRPC_MODELS_DIR") : SPECRPC_MODELS_DIR;
    const char * secs = getenv("SPECRPC_FUZZ_SECONDS");
    const double seconds = secs ? atof(secs) : 20.0;
    snprintf(g_target, sizeof g_target, "%s/stories260K-F32.gguf", dir);
    snprintf(g_draft, sizeof g_draft, "%s/stories260K-Q4_0.gguf", dir);
    for (int i = 0; i < 64; i++) g_ids[i] = i;

    char cmd[1200];
    snprintf(cmd, sizeof cmd, "-m %s -c 256 -np 2 -t 1", g_target);
    if (init(cmd) != 0) { fprintf(stderr, "FAIL: first init\n"); return 1; }

    const double start = now_s();
    g_end = start + seconds;
    double limit = g_end + 120;  /* a job or a load in flight when the time is up may take a while */
    pthread_t wd, th[kThreads];
    pthread_create(&wd, NULL, watchdog, &limit);
    for (size_t i = 0; i < kThreads; i++) pthread_create(&th[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < kThreads; i++) pthread_join(th[i], NULL);

    /* the library still works (after a deinit: an init_async of the fuzz may still be loading,
       and init answers "a model is being loaded" then) */
    deinit();
    if (init(cmd) != 0) {
        const char * st = poll_system_status();
        fail("init after the fuzz", st);
        free((void *)st);
    }
    const char * r = get_completion("{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"temperature\": 0}");
    if (!r || !strstr(r, "\"success\":true")) fail("get_completion after the fuzz", r);
    free((void *)r);
    deinit();
    __atomic_store_n(&g_done, 1, __ATOMIC_RELEASE);
    pthread_join(wd, NULL);
    fprintf(stderr, "capi fuzz: %ld calls from %d threads in %.1f s, %d failure(s)\n", g_calls, kThreads,
            now_s() - start, g_failures);
    return g_failures ? 1 : 0;
}

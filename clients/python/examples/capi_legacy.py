#!/usr/bin/env python3
"""The legacy C ABI from Python (the functions existing ctypes / Dart FFI callers use):
init, poll_system_status, tokenize, get_completion, async_completion_init/poll/cancel, deinit.

    python3 capi_legacy.py --lib build/libspecrpc.so --model stories260K-F32.gguf [--draft stories260K-Q8_0.gguf]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from specrpc.capi import Library  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.environ.get("SPECRPC_LIB", "libspecrpc.so"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--threads", type=int, default=1, help="tiny models run fastest on one thread")
    args = ap.parse_args()

    lib = Library(args.lib)
    print("libspecrpc", lib.version())
    cmd = f"-m '{args.model}' -c 512 -np 2 -t {args.threads}" + (f" -md '{args.draft}'" if args.draft else "")
    lib.init_async(cmd)  # load in the background, watch the progress
    while (st := lib.poll_system_status())["init_success"] == 0:  # 1 loaded, 0 not yet, -1 failed
        print(f"\rloading {100 * st['loading_progress']:5.1f}%", end="")
        time.sleep(0.05)
    print()
    if st["init_success"] != 1:
        sys.exit("init failed: " + st.get("error", "?"))

    t = lib.tokenize(args.prompt)
    print("tokens:", t["tokens"], "ids:", t["ids"], "length:", t["length"])
    r = lib.get_completion({"prompt": args.prompt, "n_predict": 32, "temperature": 0})
    print("get_completion:", repr(r["content"]), "stop:", r["stop_type"])

    a = lib.async_completion_init({"prompt": args.prompt, "n_predict": 64, "temperature": 0})
    sys.stdout.write("streamed: " + args.prompt)
    while True:
        p = lib.async_completion_poll(a["request_id"])
        for u in p["completion_updates"]:
            sys.stdout.write(u["content"])
        sys.stdout.flush()
        if p["finished"]:
            break
        time.sleep(0.01)
    if p.get("cancelled"):
        print("\n(cancelled)")
    print("\nresult timings:", {k: p["result"]["timings"][k] for k in ("predicted_n", "draft_n", "draft_n_accepted")})

    bad = lib.get_completion({"prompt": args.prompt, "n_predict": "lots"})
    print("a bad request:", bad["error"])
    lib.deinit()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Stream a completion from a running `specrpc serve` over HTTP (JSON-RPC + SSE).

    specrpc serve -m stories260K-F32.gguf -md stories260K-Q8_0.gguf &
    python3 http_stream.py --url http://127.0.0.1:8080 "Once upon a time"
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from specrpc import HttpClient, RpcError  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt", nargs="?", default="Once upon a time")
    ap.add_argument("--url", default=os.environ.get("SPECRPC_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--api-key", default=os.environ.get("SPECRPC_API_KEY"))
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--spec", default=None, help="speculative.type for this request: draft, ngram, lookup, none")
    args = ap.parse_args()

    c = HttpClient(args.url, api_key=args.api_key)
    print("server:", c.health())
    params = {"prompt": args.prompt, "n_predict": args.n, "temperature": 0}
    if args.spec:
        params["speculative"] = {"type": args.spec}
    try:
        s = c.stream("completion", params)
        sys.stdout.write(args.prompt)
        for chunk in s:
            sys.stdout.write(chunk["content"])
            sys.stdout.flush()
        t = s.result["timings"]
    except RpcError as e:
        sys.exit(f"\nerror {e.code}: {e.message} {e.data or ''}")
    print(f"\n\n{t['predicted_n']} tokens, {t['predicted_per_second']:.1f} t/s; drafted {t['draft_n']}, "
          f"accepted {t['draft_n_accepted']} ({100 * t['draft_accept_rate']:.1f}%)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Drive `specrpc serve --stdio` as a child process: compare the drafters on one prompt (greedy
output is identical; the statistics differ), then cancel a long streamed request.

    python3 stdio_speculation.py --bin build/specrpc --model stories260K-F32.gguf --draft stories260K-Q8_0.gguf
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from specrpc import RpcError, StdioClient  # noqa: E402

PROMPT = "Lily saw a red ball. Lily saw a red ball. Lily saw a red ball. Lily saw a"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("SPECRPC_BIN", "specrpc"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--threads", default="1", help="tiny models run fastest on one thread")
    args = ap.parse_args()
    cmd = [args.bin, "serve", "--stdio", "-m", args.model, "-c", "512", "-t", args.threads] + (["-md", args.draft] if args.draft else [])
    with StdioClient(cmd, stderr=subprocess.DEVNULL) as c:
        while True:  # the model loads in the background
            try:
                c.call("health")
                break
            except RpcError as e:
                if e.code != -32001:
                    raise
                time.sleep(0.05)
        types = ["none", "lookup", "ngram"] + (["draft"] if args.draft else [])
        for t in types:
            r = c.call("completion", {"prompt": PROMPT, "n_predict": 48, "temperature": 0,
                                      "speculative": {"type": t, "n_max": 4, "adaptive": False}})
            tm = r["timings"]
            print(f"{t:7s} drafted {tm['draft_n']:3d} accepted {tm['draft_n_accepted']:3d} "
                  f"passes {tm['n_steps']:3d}  {tm['predicted_per_second']:8.1f} t/s  {r['content'][:40]!r}")
        s = c.stream("completion", {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True})
        for i, _ in enumerate(s):
            if i == 5:
                c.cancel(s.id)
        try:
            s.result
        except RpcError as e:
            print(f"cancelled: code {e.code}, {e.data['tokens_predicted']} tokens kept: {e.data['content'][:50]!r}")


if __name__ == "__main__":
    main()

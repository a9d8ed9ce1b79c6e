"""What the whole-process benchmark scripts share (copy_bench.py, cold_bench.py, ab_whole.py):
the model arguments, a timed `specrpc generate` process, and the decode time it reports.

Imported from the scripts' own directory (Python puts a script's directory on sys.path).
"""
import os, re, subprocess, sys, time


def add_model_args(ap, target, draft, reps, n):
    """--models, --target, --draft, --reps, --n and --threads, with a script's own defaults."""
    ap.add_argument("--models", default=os.environ.get("SPECRPC_MODELS_DIR", "../shared/models"))
    ap.add_argument("--target", default=target)
    ap.add_argument("--draft", default=draft)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--n", type=int, default=n)
    ap.add_argument("--threads", type=int, default=2)


def gen_cmd(binary, target, prompt_args, n, temp, threads, ctx=1024, level="info", extra=()):
    """`specrpc generate` of n tokens (--ignore-eos) with seed 7, the prompt not echoed.
    prompt_args: ["-f", FILE] or ["-p", TEXT]."""
    return [binary, "generate", "-m", target] + list(prompt_args) + [
        "-n", str(n), "--ignore-eos", "--temp", str(temp), "--seed", "7", "-t", str(threads), "-c", str(ctx),
        "--no-display-prompt", "--log-level", level] + list(extra)


def timed(cmd, env=None):
    """Runs cmd: (first byte on stdout, whole process) in seconds from exec, and its stderr.
    Exits the script when the process fails or prints nothing."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = p.stdout.read(1)
    t_first = time.monotonic() - t0
    p.stdout.read()
    err = p.stderr.read().decode(errors="replace")
    p.wait()
    if p.returncode != 0 or not first:
        sys.exit(f"run failed ({p.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return t_first, time.monotonic() - t0, err


DECODED = re.compile(r"decoded\s+\d+ tokens in\s+([\d.]+) ms,\s+([\d.]+) t/s")


def decode_s(err):
    """The decode time `specrpc generate` reports on stderr, in seconds."""
    return float(DECODED.search(err).group(1)) / 1e3


def decode_tps(err):
    """The decode speed `specrpc generate` reports on stderr, in tokens/s."""
    return float(DECODED.search(err).group(2))

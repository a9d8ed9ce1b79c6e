"""Stand-in for the `wget` package that llama-server's tests/utils.py imports: nothing is downloaded
here (no network); specrpc_compat.py maps the one file the suite downloads to a local model."""


def download(url, out=None):
    raise RuntimeError(f"no network in the compat run: cannot download {url}")

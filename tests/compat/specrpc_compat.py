"""pytest plugin (-p specrpc_compat) that points llama-server's test suite at local models.

The suite's presets name Hugging Face repos that llama-server downloads once (ServerPreset.load_all)
and then opens with --offline. There is no network here, so this plugin, without editing the
upstream files: skips the download pass, and at each server start maps the preset's repo/file to a
GGUF under SPECRPC_MODELS_DIR (all of the suite's tiny models become stories260K, the one tiny model
family we have), passing it as --model. Everything else the suite does is left as upstream wrote it.
"""

import os
import sys

MODELS_DIR = os.environ.get("SPECRPC_MODELS_DIR", "")
TARGET = os.environ.get("SPECRPC_COMPAT_MODEL", "stories260K-F32.gguf")
DRAFT = os.environ.get("SPECRPC_COMPAT_DRAFT", "stories260K-Q8_0.gguf")

# (hf repo, hf file) of the suite's presets -> local file. Repos not listed (7B models of the slow
# tests, vision, router presets) keep their --hf-repo and fail to start, as they would offline.
LOCAL = {
    ("ggml-org/test-model-stories260K", None): TARGET,
    ("ggml-org/models", "tinyllamas/stories260K.gguf"): TARGET,
    ("ggml-org/test-model-stories260K-infill", None): TARGET,
    ("ggml-org/stories15M_MOE", "stories15M_MOE-F16.gguf"): TARGET,
    ("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf"): TARGET,
    ("ggml-org/models", "jina-reranker-v1-tiny-en/ggml-model-f16.gguf"): TARGET,
}
DOWNLOADS = {"stories15M-q4_0.gguf": DRAFT}


def _local(name):
    return os.path.join(MODELS_DIR, name)


def pytest_configure(config):
    tests_dir = str(config.rootpath)
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    import utils  # the suite's own helpers; conftest.py imports the same module

    utils.ServerPreset.load_all = staticmethod(lambda: None)

    original_start = utils.ServerProcess.start

    def start(self, *args, **kwargs):
        key = (self.model_hf_repo, self.model_hf_file)
        if self.model_file is None and key in LOCAL:
            self.model_file = _local(LOCAL[key])
            self.model_hf_repo = None
            self.model_hf_file = None
        return original_start(self, *args, **kwargs)

    utils.ServerProcess.start = start

    original_download = utils.download_file

    def download_file(url, output_file_path=None):
        name = url.split("/")[-1]
        if name in DOWNLOADS:
            return _local(DOWNLOADS[name])
        return original_download(url, output_file_path)

    utils.download_file = download_file

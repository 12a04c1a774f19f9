#!/usr/bin/env bash
# The peer of `make bench-serve`: llama.cpp's native `llama-server`, built from the source vendored in the
# llama-cpp-python 0.3.36 sdist (pip is the only registry it needs), and the built-in `tiny` converted to an
# f32 GGUF with that tree's convert_hf_to_gguf.py. Then a greedy check: llama-server's text for one prompt
# must equal `llmlab generate`'s, token for token, or the comparison is not of the same model.
#
#   benchmarks/llamacpp.sh [all|fetch|build|convert|check]   (default all; each step skips what is done)
#
# Environment:
#   LLAMACPP_DIR  where everything goes (default ~/.cache/llmlab/llamacpp; outside the repository)
#   JOBS          parallel compile jobs (default 1: on a shared 2-core machine a -j2 build starves the rest)
#   PY            the Python that runs the converter and llmlab (default .venv/bin/python: it has torch,
#                 numpy, transformers; the gguf package comes from the vendored gguf-py through PYTHONPATH)
#   NICE          a prefix for the compile, e.g. "nice -n 19 taskset -c 0" (default "nice -n 19")
#
#   benchmarks/llamacpp.sh serve   runs the peer in the foreground on 127.0.0.1:$PORT (default 8090) with
#                                  $THREADS threads (default 1; -t and -tb), pinned to $CPUS (taskset -c; default
#                                  unpinned), 32 parallel slots (one per client of bench-serve's C = 32) sharing a
#                                  context of 8,192 tokens (256 per slot: a request is 40 + 64)
set -euo pipefail

VERSION=0.3.36
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=${LLAMACPP_DIR:-$HOME/.cache/llmlab/llamacpp}
JOBS=${JOBS:-1}
PY=${PY:-$REPO/.venv/bin/python}
NICE=${NICE:-nice -n 19}
SRC=$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp
GGUF=$DIR/tiny-f32.gguf
SERVER=$DIR/build/bin/llama-server
PROMPT="Once upon a time"
mkdir -p "$DIR"

fetch() {
  [ -d "$SRC" ] && return
  # the sdist, not a wheel: it carries llama.cpp's source (metadata preparation builds pure-Python build deps)
  "$PY" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$DIR"
  tar -xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
}

build() {
  [ -x "$SERVER" ] && return
  # CURL, OpenSSL and the prebuilt web UI are off: the build must not reach the network (nor need it)
  cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  $NICE cmake --build "$DIR/build" --target llama-server -j "$JOBS"
}

convert() {
  [ -s "$GGUF" ] && return
  # tiny's tokenizer is byte-level BPE with GPT-2's pre-tokenizer (ByteLevel, use_regex) and no tokenizer.model.
  # The converter's Llama path tries SentencePiece first (an ImportError where sentencepiece is not installed,
  # which it does not catch), and names a BPE pre-tokenizer by the hash of a test string's ids, which only a
  # published vocabulary has. So: GPT-2's vocabulary path, pre-tokenizer "gpt-2"; `check` proves the result.
  PYTHONPATH=$SRC:$SRC/gguf-py "$PY" - "$SRC/convert_hf_to_gguf.py" "$REPO/llmlab/tiny/weights/tiny" \
    --outtype f32 --outfile "$GGUF" <<'PYTHON'
import runpy
import sys

from conversion.base import TextModel
from conversion.llama import LlamaModel

LlamaModel.set_vocab = lambda self: self._set_vocab_gpt2()
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PYTHON
}

check() {
  local port=${CHECK_PORT:-8097} pid ours theirs
  "$SERVER" -m "$GGUF" --host 127.0.0.1 --port "$port" -t 1 -np 1 -c 512 >"$DIR/check-server.log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' RETURN
  for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  theirs=$(curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"$PROMPT\", \"max_tokens\": 48, \"temperature\": 0}" \
    | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"], end="")')
  ours=$(HF_HUB_OFFLINE=1 "$PY" -m llmlab generate "$PROMPT" -n 48 --temperature 0 --device cpu 2>/dev/null)
  printf 'llama.cpp: %q\nllmlab:    %q\n' "$theirs" "$ours"
  # llmlab generate prints the prompt and then the continuation
  if [ "$PROMPT$theirs" = "$ours" ] || [ "$theirs" = "$ours" ]; then
    echo "greedy text identical (48 tokens of \"$PROMPT\")"
  else
    echo "greedy text DIFFERS: the two servers do not run the same model" >&2
    return 1
  fi
}

serve() {
  local pin=()
  [ -n "${CPUS:-}" ] && pin=(taskset -c "$CPUS")
  exec "${pin[@]}" "$SERVER" -m "$GGUF" --host 127.0.0.1 --port "${PORT:-8090}" -t "${THREADS:-1}" \
    -tb "${THREADS:-1}" -np 32 -c 8192
}

case ${1:-all} in
  fetch) fetch ;;
  build) fetch; build ;;
  convert) fetch; convert ;;
  check) check ;;
  all) fetch; build; convert; check ;;
  serve) serve ;;
  *) echo "usage: $0 [all|fetch|build|convert|check|serve]" >&2; exit 2 ;;
esac

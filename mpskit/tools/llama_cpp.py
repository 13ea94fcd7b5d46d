"""A GGUF file run by llama.cpp itself: the xllamacpp wheel runs llama-server's own request handlers in
this process. `mpskit chat FILE.gguf` answers once or chats on standard input, through the file's own
chat template (Jinja, as the export wrote it); `mpskit serve` opens llama-server's OpenAI-compatible
endpoints on 127.0.0.1 until Ctrl-C. Where xllamacpp is missing, one line says how to install it.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.run.quiet import is_verbose
from mpskit.tools.use_run import converse, show

INSTALL = "pip install 'mpskit[gguf]' (make install brings it)"
CONTEXT = 4096  # tokens a conversation may hold (the Modelfile's num_ctx too)
SERVED_TYPE = "q8_0"  # a run folder served is exported to this first


def _xllamacpp():
    try:
        import xllamacpp
    except ImportError:
        raise MpskitError("running a GGUF file needs llama.cpp's Python wheel, xllamacpp", INSTALL) from None
    return xllamacpp


@contextmanager
def llama_server(model: Path, port: int = 0) -> Iterator[object]:
    """llama.cpp's server for MODEL, listening on 127.0.0.1:PORT (0: a free port), stopped on leaving."""
    if not model.is_file():
        raise MpskitError(f"GGUF file {model} not found", "check the path; mpskit export RUN --gguf q8_0 writes one")
    xlc = _xllamacpp()
    params = xlc.CommonParams()
    params.model.path = str(model)
    params.n_ctx = CONTEXT
    params.use_jinja = True  # the file's own template, rendered as written (no guess by its shape)
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.model_alias = {model.stem}  # the model's name in /v1/models (a set of names)
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = os.cpu_count() or 1
    params.verbosity = 3 if is_verbose() else 0  # llama.cpp's own lines: with -v
    try:
        server = xlc.Server(params)
    except RuntimeError:
        if port and _taken(port):
            raise MpskitError(f"port {port} on 127.0.0.1 is in use", "give --port another number") from None
        raise MpskitError(f"llama.cpp cannot load {model}", "give a whole GGUF file (mpskit export RUN --gguf "
                          "q8_0 writes one); -v shows llama.cpp's reason") from None  # fmt: skip
    try:
        yield server
    finally:
        del server  # its destructor stops the loop and frees the port


def _taken(port: int) -> bool:
    """Whether a process listens on the port (as servers bind, connections closing there do not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def reply(server, messages: list[dict], max_tokens: int, temperature: float | None = None, stream=None) -> str:
    """The model's answer to MESSAGES through llama.cpp's chat handler; STREAM(text) gets each piece."""
    request = {"messages": messages, "max_tokens": max_tokens}
    if temperature is not None:
        request["temperature"] = temperature
    if stream is None:
        result = server.handle_chat_completions(request)
        if "error" in result:
            raise MpskitError(f"llama.cpp answered with an error: {result['error']}", "see -v for its log")
        return result["choices"][0]["message"]["content"]
    pieces: list[str] = []

    def take(chunk: dict) -> None:
        for choice in chunk.get("choices", []):
            if text := (choice.get("delta") or {}).get("content"):
                pieces.append(text)
                stream(text)

    server.handle_chat_completions({**request, "stream": True}, take)
    return "".join(pieces)


def chat_file(model: Path, prompt: str | None, max_tokens: int, temperature: float | None) -> None:
    """One answer to PROMPT, or a chat on standard input (use_run.converse)."""
    with llama_server(model) as server:
        if prompt is not None:
            print(reply(server, [{"role": "user", "content": prompt}], max_tokens, temperature))
            return
        converse(lambda messages: reply(server, messages, max_tokens, temperature, stream=show))


def serve(source: str, port: int, allow_unfinished: bool = False) -> None:
    """An OpenAI-compatible endpoint on 127.0.0.1:PORT for a GGUF file, or for a run folder exported
    first to a temporary q8_0 file (removed when the server stops). Ctrl-C or SIGTERM stops it."""
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        _serve(path, port)
        return
    from mpskit.temporary import private_folder
    from mpskit.tools.gguf_export import export_gguf

    folder = private_folder("mpskit-serve-")
    print(f"mpskit: exporting {source} to a temporary {SERVED_TYPE} file in {folder}", file=sys.stderr, flush=True)
    _serve(export_gguf(source, folder / "model", SERVED_TYPE, allow_unfinished), port)


def _serve(model: Path, port: int) -> None:
    with llama_server(model, port) as server:
        address = server.listening_address
        print(f"mpskit: serving {model.name} at {address}/v1 (OpenAI-compatible: /v1/chat/completions, "
              f"/v1/completions, /v1/models); Ctrl-C stops it", file=sys.stderr, flush=True)  # fmt: skip
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, lambda *_: stop.set())
        while not stop.wait(0.5):
            pass
    print("mpskit: stopped; the port is free", file=sys.stderr)

"""Speech synthesis with eSpeak NG, offline: the C library and its voice data as the ``espeakng-loader``
wheel bundles them, called through ``ctypes`` (the ``[audio]`` extra).

eSpeak NG is a formant synthesiser (GPL-3.0; the library is loaded, not copied). ``synthesize`` renders
one text with a voice, a rate in words per minute and a pitch (0-99) into float32 samples in [-1, 1]
at the library's native rate (22,050 Hz):

    espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, ...) -> sample rate
    espeak_SetVoiceByName(voice); espeak_SetParameter(RATE | PITCH, value)
    espeak_Synth(text) -> the callback receives int16 chunks, concatenated here

The library keeps global state, so calls are serialised with a lock. That state also carries from one
utterance to the next (the same text comes out a few samples different on a second call), and breathy
voices draw noise from libc's rand(), which the library seeds from the clock; so each synthesis reseeds
rand() with 0 and ``synthesize_many`` renders a list of utterances in a fresh interpreter: the same
list gives the same samples in any process, whatever was synthesised before.
"""

from __future__ import annotations

import ctypes
import io
import json
import subprocess
import sys
import threading

import numpy as np

from attnlab.core.errors import DataError
from attnlab.core.extras import require

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_RATE, _PITCH = 1, 3
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class _Engine:
    """The loaded library, its sample rate, and the buffer the synthesis callback fills."""

    def __init__(self) -> None:
        loader = require("espeakng_loader", "speech synthesis")
        lib = ctypes.cdll.LoadLibrary(loader.get_library_path())
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        data = loader.get_data_path().encode()
        self.sample_rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data, 0)
        if self.sample_rate <= 0:
            raise DataError(f"eSpeak NG failed to initialise from {data.decode()}")
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        self.lib = lib
        self.libc = ctypes.CDLL(None)
        self.chunks: list[np.ndarray] = []
        self.callback = _CALLBACK(self._receive)  # kept referenced for the library's lifetime
        lib.espeak_SetSynthCallback(self.callback)
        self.lock = threading.Lock()

    def _receive(self, wav, n: int, _events) -> int:
        if n > 0:
            self.chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0  # 0: continue synthesis


_engine: _Engine | None = None


def engine() -> _Engine:
    """The process-wide engine (loaded on first use)."""
    global _engine
    if _engine is None:
        _engine = _Engine()
    return _engine


def sample_rate() -> int:
    """The synthesiser's native sample rate in Hz."""
    return engine().sample_rate


def synthesize(text: str, voice: str = "en", rate: int = 175, pitch: int = 50) -> np.ndarray:
    """``text`` spoken by ``voice`` (a name such as ``en-us`` or ``en+f3``) at ``rate`` words per minute
    (80-450) and ``pitch`` (0-99) -> float32 samples (n,) in [-1, 1] at ``sample_rate()``."""
    if not 80 <= rate <= 450:
        raise DataError(f"speech rate must be 80..450 words per minute, got {rate}")
    if not 0 <= pitch <= 99:
        raise DataError(f"speech pitch must be 0..99, got {pitch}")
    e = engine()
    with e.lock:
        if e.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise DataError(f"eSpeak NG has no voice '{voice}'")
        e.lib.espeak_SetParameter(_RATE, rate, 0)
        e.lib.espeak_SetParameter(_PITCH, pitch, 0)
        e.chunks = []
        raw = text.encode() + b"\0"
        e.libc.srand(0)  # breathy voices draw noise from rand(), which the library seeds from the clock
        e.lib.espeak_ng_SetRandSeed(0)
        e.lib.espeak_Synth(raw, len(raw), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        e.lib.espeak_Synchronize()
        samples = np.concatenate(e.chunks) if e.chunks else np.zeros(0, np.int16)
    return samples.astype(np.float32) / 32768.0


def synthesize_many(items: list[tuple[str, str, int, int]]) -> tuple[list[np.ndarray], int]:
    """(text, voice, rate, pitch) per utterance -> (their samples, the sample rate), rendered in order by a
    freshly started interpreter (``python -m attnlab.data.espeak``), so the result depends on ``items`` only."""
    engine()  # a missing extra or a broken library is reported here, in this process, in one line
    done = subprocess.run([sys.executable, "-m", "attnlab.data.espeak"], input=json.dumps(items).encode(),
                          capture_output=True, check=False)
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()
        raise DataError(f"eSpeak NG synthesis failed: {last[-1] if last else f'exit status {done.returncode}'}")
    with np.load(io.BytesIO(done.stdout)) as z:
        samples, lengths, rate = z["samples"], z["lengths"], int(z["rate"])
    return np.split(samples, np.cumsum(lengths)[:-1]), rate


def _main() -> None:
    """Read a JSON list of [text, voice, rate, pitch] on stdin, write an .npz (samples, lengths, rate) to stdout."""
    items = json.loads(sys.stdin.buffer.read())
    waves = [synthesize(*item) for item in items]
    buffer = io.BytesIO()
    np.savez(buffer, samples=np.concatenate(waves) if waves else np.zeros(0, np.float32),
             lengths=np.array([len(w) for w in waves], dtype=np.int64), rate=np.array(sample_rate()))
    sys.stdout.buffer.write(buffer.getvalue())


if __name__ == "__main__":
    _main()
